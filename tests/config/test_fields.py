"""Each config key is declared once, on its schema field: help, bound, resume rule and
legacy value live in the field's metadata, and every reader (reports, the key table of
docs/config-keys.md, the resume comparison, the legacy fill, validator fixes) takes them
from there."""

from __future__ import annotations

import dataclasses
import inspect
import re
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import art_hydra.config.schema as schema
from art_hydra import ConfigValidationError, compose
from art_hydra.config import fields
from art_hydra.config.composition import check
from art_hydra.runs import run_folder

ROOT = Path(__file__).resolve().parents[2]

#: The leaf keys of the schema when run folders were first written (10222b5). A key added
#: since then reaches run folders saved without it, so it must say how they resume.
FIRST_RUN_FOLDER_KEYS = frozenset(
    {
        "algorithm.name",
        "backend.device",
        "backend.gradient_checkpointing",
        "backend.name",
        "checkpoint.dir",
        "checkpoint.every_steps",
        "checkpoint.keep_last",
        "dry_run",
        "logging.every_steps",
        "logging.plot",
        "logging.progress_bar",
        "logging.tensorboard",
        "model.dtype",
        "model.finetune",
        "model.load_in_4bit",
        "model.lora.alpha",
        "model.lora.dropout",
        "model.lora.modules_to_save",
        "model.lora.r",
        "model.lora.target_modules",
        "model.max_seq_length",
        "model.name",
        "model.revision",
        "model.source",
        "model.tiny.hidden_size",
        "model.tiny.init_std",
        "model.tiny.intermediate_size",
        "model.tiny.num_heads",
        "model.tiny.num_layers",
        "model.trust_remote_code",
        "producer.log_completions",
        "producer.shuffle",
        "queue.input_timeout_s",
        "queue.maxsize",
        "queue.result_timeout_s",
        "resume",
        "rl.beta",
        "rl.epsilon",
        "rl.epsilon_high",
        "rl.loss_type",
        "rl.max_completion_length",
        "rl.max_prompt_length",
        "rl.num_generations",
        "rl.scale_rewards",
        "rl.temperature",
        "rl.top_k",
        "rl.top_p",
        "seed",
        "sft.completion_only_loss",
        "sft.max_length",
        "strict",
        "task.allowed_modules",
        "task.generator",
        "task.name",
        "task.num_examples",
        "task.params",
        "task.path",
        "task.reward._target_",
        "task.source",
        "trainer.adam_beta1",
        "trainer.adam_beta2",
        "trainer.adam_epsilon",
        "trainer.gradient_accumulation_steps",
        "trainer.learning_rate",
        "trainer.lr_scheduler_type",
        "trainer.max_grad_norm",
        "trainer.max_steps",
        "trainer.per_device_train_batch_size",
        "trainer.warmup_pass",
        "trainer.warmup_steps",
        "trainer.weight_decay",
    }
)


def _schema_classes() -> list[type]:
    return [
        obj
        for _, obj in inspect.getmembers(schema, inspect.isclass)
        if dataclasses.is_dataclass(obj) and obj.__module__ == schema.__name__
    ]


@pytest.mark.parametrize("cls", _schema_classes(), ids=lambda c: c.__name__)
def test_every_schema_field_declares_its_help_and_a_valid_resume_rule(cls: type) -> None:
    for f in dataclasses.fields(cls):
        info = fields.field_info(cls, f.name)
        assert info.help.strip(), f"{cls.__name__}.{f.name} has no help"
        assert info.help == fields.help_of(cls, f.name)
        assert info.resume in fields.RESUME_RULES, f"{cls.__name__}.{f.name}: {info.resume}"


def test_no_field_help_quotes_a_benchmark_figure() -> None:
    figure = re.compile(r"\d(\.\d+)?x\b|measured|\bms\b|tokens/s|speed-?up", re.IGNORECASE)
    for key, cls, name in fields.leaves():
        assert not figure.search(fields.help_of(cls, name)), key


def test_the_schema_module_carries_no_field_comments() -> None:
    """Help lives in the metadata only: a comment above a field would be a second copy."""
    source = (ROOT / "art_hydra" / "config" / "schema.py").read_text().splitlines()
    field_line = re.compile(r"^    \w+: .+ = ")
    for i, line in enumerate(source):
        if field_line.match(line):
            assert not source[i - 1].strip().startswith("#"), f"schema.py:{i}: {source[i - 1]}"


def test_every_key_added_after_the_first_run_folders_says_how_old_runs_resume() -> None:
    """A saved config without the key is compared as if it held ``legacy``; a key a
    resume may change needs none."""
    for key, cls, name in fields.leaves():
        if key in FIRST_RUN_FOLDER_KEYS:
            continue
        info = fields.field_info(cls, name)
        assert info.has_legacy or info.resume == fields.MAY_CHANGE, (
            f"{key} was added after run folders were first written: give it legacy=<the value "
            "that reproduces older runs> or resume='may_change'"
        )


def test_resume_rules_and_legacy_values_are_those_the_run_folder_always_used() -> None:
    assert fields.may_change_keys() == [
        "model.master_weights",
        "backend.cpu_threads",
        "trainer.max_steps",
        "trainer.num_train_epochs",
        "rl.importance_sampling_mode",
        "rollout.*",
        "producer.log_completions",
        "queue.*",
        "timeouts.*",
        "distributed.strategy",
        "distributed.fsdp.reshard_after_forward",
        "distributed.fsdp.cpu_offload",
        "checkpoint.every_steps",
        "checkpoint.keep_last",
        "logging.*",
        "objective.*",
        "eval.every_steps",
        "eval.max_examples",
        "eval.batch_size",
        "eval.max_completion_length",
        "eval.num_samples",
        "eval.temperature",
        "eval.log_completions",
        "dry_run",
        "resume",
        "strict",
    ]
    assert fields.legacy_values() == {
        "rl.num_iterations": 1,
        "rl.steps_per_generation": 1,
        "rl.overlap_rollouts": False,
        "rl.importance_sampling_cap": None,
        "rl.importance_sampling_mode": "token_truncate",
        "rl.advantage_estimator": "group_relative",
        "rollout.engine": "torch",
        "rollout.vllm.gpu_memory_utilization": 0.3,
        "rollout.vllm.enforce_eager": False,
        "rollout.vllm.kv_cache_gib": None,
        "rollout.vllm.max_model_len": None,
        "rollout.vllm.max_lora_rank": None,
        "rollout.vllm.lora_sync": "adapter",
        "rollout.vllm.sleep": None,
        "model.master_weights": False,
        "producer.share_prompts": False,
        "backend.cpu_threads": None,
        "distributed.world_size": 1,
        "distributed.backend": "auto",
        "distributed.timeout_s": 300.0,
        # Issue 37's sharding: older runs kept a whole model on every rank.
        "distributed.strategy": "ddp",
        "distributed.fsdp.reshard_after_forward": True,
        "distributed.fsdp.cpu_offload": False,
        "task.split": "train",
        "task.columns.prompt": "prompt",
        "task.columns.answer": None,
        "task.columns.messages": "messages",
        "task.system_prompt": None,
        "task.rewards": [],
        "task.allow_remote_data": False,
        "eval.fraction": 0.0,
        "eval.path": None,
        "eval.split": None,
        # Issue 36's agent keys: older runs had no environment, tools or template of their own.
        "model.chat_template": None,
        "rl.max_tool_calls": 8,
        "rl.sft_warm_start_steps": 0,
        "rl.sft_warm_start_learning_rate": None,
        "task.environment": {},
        "task.tools": [],
        "task.tool_parser": "auto",
        # Issue 38: today's normalisation is TRL's dapo; older runs sized by max_steps.
        "rl.loss_aggregation": "dapo",
        "trainer.num_train_epochs": None,
        "logging.trackers_dir": None,
    }


def test_may_change_follows_the_deepest_field_and_old_keys_of_open_sections() -> None:
    assert run_folder.may_change("logging.progress_bar")
    assert run_folder.may_change("timeouts.step_s")
    assert not run_folder.may_change("rl.top_p")
    assert not run_folder.may_change("task.params.length")  # governed by task.params
    assert not run_folder.may_change("task.reward._target_")
    # A key of an older version, saved in an older run's config: queue.* may change.
    assert run_folder.may_change("queue.result_timeout_s")
    assert not run_folder.may_change("rl.some_old_key")
    assert not run_folder.may_change("not_a_section.key")


def test_a_saved_config_without_a_later_key_is_compared_with_its_legacy_value() -> None:
    cfg = OmegaConf.structured(schema.RunConfig)
    with_defaults = run_folder.plain(
        OmegaConf.merge(cfg, {"model": {"name": "m"}, "task": {"name": "t"}})
    )
    saved = {k: v for k, v in with_defaults.items() if k != "distributed"}
    saved["producer"] = {k: v for k, v in saved["producer"].items() if k != "share_prompts"}
    new = OmegaConf.merge(cfg, with_defaults)
    diff = {k: (old, now) for k, old, now in run_folder.differences(saved, new)}
    # The legacy values of distributed.backend and timeout_s are today's defaults;
    # those of share_prompts and world_size (null: the launcher's) are not.
    assert diff == {"producer.share_prompts": (False, True), "distributed.world_size": (1, None)}


def test_a_misspelt_key_is_reported_with_the_whole_help_of_the_key_meant() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["+rl.epsilon_hig=0.3"])
    (problem,) = [p for p in info.value.problems if p.key == "rl.epsilon_hig"]
    assert "Did you mean rl.epsilon_high?" in problem.reason
    assert fields.help_of(schema.RLConfig, "epsilon_high") in problem.reason
    assert problem.reason.endswith("required with cispo.")


def test_a_missing_value_is_reported_with_the_whole_help() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["model.name=???"])
    (problem,) = [p for p in info.value.problems if p.key == "model.name"]
    assert fields.help_of(schema.ModelConfig, "name").rstrip(".") in problem.reason


@pytest.mark.parametrize(
    ("key", "value"), [("rl.top_k", 1), ("rl.top_p", 0.2), ("rl.temperature", 0.05)]
)
def test_validator_fixes_restore_the_schema_default(key: str, value: float) -> None:
    cfg = compose()
    OmegaConf.update(cfg, key, value)
    _, problems = check(cfg)
    (problem,) = [p for p in problems if p.key == key]
    assert dict(problem.fix.sets)[key] == fields.default(key)


def _docs_block() -> str:
    text = (ROOT / fields.KEY_TABLE_PAGE).read_text()
    start = text.index(fields.TABLE_START) + len(fields.TABLE_START) + 1
    return text[start : text.index(fields.TABLE_END)]


def test_the_docs_key_table_is_the_generated_one() -> None:
    assert _docs_block() == fields.key_table_markdown(), (
        f"{fields.KEY_TABLE_PAGE}'s key table is out of date: replace the block between "
        f"{fields.TABLE_START} and {fields.TABLE_END} with the output of "
        "`python -m art_hydra.config.fields --markdown`"
    )


def test_the_readme_holds_no_key_table() -> None:
    """The table has one home, the docs page; the README links to it."""
    readme = (ROOT / "README.md").read_text()
    assert fields.TABLE_START not in readme and "| `model.name` |" not in readme
    assert fields.KEY_TABLE_PAGE in readme


def test_the_key_table_lists_every_key_once() -> None:
    rows = [line for line in fields.key_table_markdown().splitlines()[2:]]
    listed = [row.split("`")[1] for row in rows]
    assert listed == [key for key, _, _ in fields.leaves()]
    assert len(set(listed)) == len(listed)


@pytest.mark.parametrize("flag", ["--markdown", "--readme"])
def test_the_module_prints_the_table(flag: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "art_hydra.config.fields", flag],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == fields.key_table_markdown()


def test_help_lists_every_key_with_its_whole_help(cli) -> None:
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    out = " ".join(proc.stdout.split())  # the help is wrapped to the terminal
    assert "== Config keys ==" in out
    for key, cls, name in fields.leaves():
        assert f"{key} (" in out, key
        assert " ".join(fields.help_of(cls, name).split()) in out, key
    assert "rl.epsilon_high (default null; > 0)" in out
    assert "trainer.max_steps (default null; at least 1; a resume may change it)" in out
