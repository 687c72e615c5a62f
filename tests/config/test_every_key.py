"""Every key the user sets is read, warned about, or refused: none does nothing silently.

For each key of the schema (:func:`art_hydra.config.fields.leaves`), under
``algorithm=rl`` and ``algorithm=sft``, with evaluation off and on (``eval.fraction=0.1``),
the key is set to a valid value other than the one the config already has, composed
in-process as the CLI composes it (no model, no files), and the verdict is one of three:

- **refused**: an error names the key;
- **warned**: a warning names the key;
- **read**: the run reads the key in this configuration, as :data:`READ_WHEN` declares.

:data:`READ_WHEN` is the declaration the test checks the rules against: for each key,
the condition under which the run reads it (read from the engine: the producer, trainer,
evaluator, trackers and world set-up), or :func:`every_run`. It names every schema key, so a
new key fails here until someone decides when it is read. A key the declaration says is
not read, that no problem names, is a silent setting (a bug: a rule of
:mod:`art_hydra.config.inert` belongs to it); a key it says is read, that a warning
calls "never read", is a false warning.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import pytest
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from art_hydra.config.bounds import type_hints
from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.eval_rules import enabled as evaluates
from art_hydra.config.fields import leaves
from art_hydra.config.inert import sweeping
from art_hydra.config.policy_losses import LOSS_SETTINGS, get_policy_loss
from art_hydra.config.problems import Problem, Severity
from art_hydra.config.schema import AlgorithmName, FinetuneMethod, ModelSource, TaskSource
from art_hydra.config.tracker_names import TENSORBOARD, chosen_trackers

SCENARIOS: dict[str, list[str]] = {
    "rl": ["algorithm=rl"],
    "rl+eval": ["algorithm=rl", "eval.fraction=0.1"],
    "sft": ["algorithm=sft"],
    "sft+eval": ["algorithm=sft", "eval.fraction=0.1"],
    # vLLM loads a model folder (refused for the tiny one); composition reads no files.
    "rl+vllm": ["algorithm=rl", "model=pretrained", "model.name=org/model", "rollout.engine=vllm"],
}

Reads = Callable[[DictConfig], bool]


def every_run(c: DictConfig) -> bool:
    return True


def _rl(c: DictConfig) -> bool:
    return c.algorithm.name == AlgorithmName.rl


def _sft(c: DictConfig) -> bool:
    return c.algorithm.name == AlgorithmName.sft


def _rl_or(evaluation_reads: Reads) -> Reads:
    """An rl.* setting: read by RL, and by either algorithm's evaluation when it says so
    (engine/evaluation.py generates with rl.max_completion_length and rl.top_k/top_p)."""
    return lambda c: _rl(c) or (evaluates(c) and evaluation_reads(c))


def _loss_reads(name: str) -> Reads:
    """A clip setting: read by the policy losses whose registration lists it."""
    return lambda c: _rl(c) and name in get_policy_loss(c.rl.loss_type).settings


def _source(source: TaskSource) -> Reads:
    return lambda c: c.task.source == source


def _tiny(c: DictConfig) -> bool:
    return c.model.source == ModelSource.tiny


def _lora(c: DictConfig) -> bool:
    return c.model.finetune == FinetuneMethod.lora


def _rewards_called(c: DictConfig) -> bool:
    """RL scores every rollout; SFT calls a reward only at evaluation."""
    return _rl(c) or evaluates(c)


def _agentic(c: DictConfig) -> bool:
    """The task has an environment or tools: the multi-turn loop runs."""
    return bool(c.task.environment) or bool(c.task.tools)


def _several_ranks(c: DictConfig) -> bool:
    return (c.distributed.world_size or 1) > 1


def _sharded(c: DictConfig) -> bool:
    """distributed.strategy=fsdp on several ranks: FSDP2 is given distributed.fsdp.*."""
    return _several_ranks(c) and c.distributed.strategy.name == "fsdp"


def _vllm(also: Reads = every_run) -> Reads:
    """A rollout.vllm.* setting: read when vLLM samples RL's rollouts (SFT samples none,
    and its evaluation uses the built-in sampler), and ``also`` holds."""
    return lambda c: _rl(c) and str(c.rollout.engine) == "vllm" and also(c)


def _adapter_synced(c: DictConfig) -> bool:
    return _lora(c) and c.rollout.vllm.lora_sync == "adapter"


#: When the run reads each key: the declaration this test checks the rules against.
READ_WHEN: dict[str, Reads] = {
    "model.name": every_run,  # the tiny model's label in logs; a pretrained one's folder
    "model.source": every_run,
    "model.max_seq_length": every_run,
    "model.dtype": every_run,
    "model.master_weights": every_run,
    "model.load_in_4bit": lambda c: not _tiny(c) and _lora(c),
    "model.finetune": every_run,
    **{f"model.lora.{k}": _lora for k in ("r", "alpha", "dropout", "target_modules")},
    "model.lora.modules_to_save": _lora,
    **{
        f"model.tiny.{k}": _tiny
        for k in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "init_std")
    },
    "model.revision": lambda c: not _tiny(c),
    "model.trust_remote_code": lambda c: not _tiny(c),
    "backend.name": every_run,
    "backend.device": every_run,
    "backend.gradient_checkpointing": every_run,
    "backend.cpu_threads": lambda c: c.backend.device.name != "cuda",
    "algorithm.name": every_run,
    **{
        f"trainer.{k}": every_run
        for k in (
            "learning_rate",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "max_steps",
            "num_train_epochs",
            "max_grad_norm",
            "weight_decay",
            "warmup_steps",
            "lr_scheduler_type",
            "adam_beta1",
            "adam_beta2",
            "adam_epsilon",
            "warmup_pass",
        )
    },
    **{
        f"rl.{k}": _rl
        for k in (
            "num_generations",
            "max_prompt_length",
            "temperature",
            "beta",
            "num_iterations",
            "steps_per_generation",
            "loss_type",
            "loss_aggregation",
            "scale_rewards",
            "advantage_estimator",
            "importance_sampling_cap",
            "overlap_rollouts",
        )
    },
    "rl.importance_sampling_mode": lambda c: _rl(c) and c.rl.importance_sampling_cap is not None,
    # The engine samples RL's rollouts and RL's evaluation; SFT's evaluation uses the
    # built-in sampler on the policy (engine/evaluation.py gets no engine from SFT).
    "rollout.engine": _rl,
    "rollout.vllm.gpu_memory_utilization": _vllm(),
    **{f"rollout.vllm.{k}": _vllm() for k in ("enforce_eager", "kv_cache_gib", "sleep")},
    "rollout.vllm.max_model_len": _vllm(),
    "rollout.vllm.max_lora_rank": _vllm(_adapter_synced),
    "rollout.vllm.lora_sync": _vllm(_lora),
    "rl.max_completion_length": _rl_or(lambda c: c.eval.max_completion_length is None),
    "rl.top_k": _rl_or(lambda c: c.eval.num_samples > 0),
    "rl.top_p": _rl_or(lambda c: c.eval.num_samples > 0),
    **{f"rl.{name}": _loss_reads(name) for name in LOSS_SETTINGS},
    "sft.max_length": _sft,
    "sft.completion_only_loss": _sft,
    # The producer packs SFT's examples too; the queue carries both algorithms' steps.
    **{f"producer.{k}": every_run for k in ("shuffle", "log_completions", "share_prompts")},
    "queue.input_timeout_s": every_run,
    "queue.maxsize": every_run,
    # rollout_s + reward_s bound the making of every step's inputs (recipe.py), SFT's too.
    **{f"timeouts.{k}": every_run for k in ("rollout_s", "reward_s", "step_s", "checkpoint_s")},
    "distributed.world_size": every_run,
    "distributed.backend": _several_ranks,
    "distributed.timeout_s": _several_ranks,
    # Sharding happens on several ranks only (one rank trains as one process).
    "distributed.strategy": _several_ranks,
    **{f"distributed.fsdp.{k}": _sharded for k in ("reshard_after_forward", "cpu_offload")},
    "task.name": every_run,
    "task.source": every_run,
    "task.generator": _source(TaskSource.generated),
    "task.path": lambda c: c.task.source != TaskSource.generated,
    "task.split": _source(TaskSource.dataset),
    "task.columns.prompt": _source(TaskSource.dataset),
    "task.columns.answer": _source(TaskSource.dataset),
    "task.columns.messages": _source(TaskSource.dataset),
    "task.system_prompt": every_run,
    "task.num_examples": _source(TaskSource.generated),
    "task.params": _source(TaskSource.generated),
    "task.reward._target_": lambda c: _rewards_called(c) and not len(c.task.rewards),
    "task.rewards": _rewards_called,
    "task.allowed_modules": every_run,  # the trust check of every target
    "task.allow_remote_data": _source(TaskSource.dataset),
    # The agent keys: the environment and tools are read by either algorithm (RL's
    # rollouts, SFT's rendering of conversations); the loop's settings only with them.
    "task.environment": every_run,
    "task.tools": every_run,
    "task.tool_parser": _agentic,
    "rl.max_tool_calls": lambda c: _rl(c) and _agentic(c),
    "rl.sft_warm_start_steps": _rl,
    "rl.sft_warm_start_learning_rate": lambda c: _rl(c) and c.rl.sft_warm_start_steps > 0,
    "timeouts.tool_s": _agentic,
    "model.chat_template": every_run,
    "checkpoint.every_steps": every_run,
    "checkpoint.keep_last": every_run,
    "checkpoint.dir": every_run,
    "logging.every_steps": every_run,
    "logging.tensorboard": every_run,
    "logging.report_to": every_run,
    "logging.project": lambda c: any(n != TENSORBOARD for n in chosen_trackers(c.logging)),
    "logging.trackers_dir": lambda c: any(n != TENSORBOARD for n in chosen_trackers(c.logging)),
    "logging.plot": every_run,
    "logging.progress_bar": every_run,
    "logging.progress_every_steps": every_run,  # the log file's lines, bar or not
    "logging.progress_every_s": every_run,
    # Every run returns its objective (result.json, TensorBoard's hparams).
    **{f"objective.{k}": every_run for k in ("metric", "reduce", "window", "direction")},
    # The switches that turn evaluation on are read either way.
    "eval.fraction": every_run,
    "eval.path": every_run,
    "eval.split": every_run,
    **{
        f"eval.{k}": evaluates
        for k in (
            "every_steps",
            "max_examples",
            "batch_size",
            "max_completion_length",
            "num_samples",
            "log_completions",
        )
    },
    "eval.temperature": lambda c: evaluates(c) and c.eval.num_samples > 0,
    "seed": every_run,
    "dry_run": every_run,
    "resume": every_run,
    "strict": every_run,
}

#: Values for keys whose type alone does not give a valid other value (strings, lists,
#: registry names), or whose next value would be refused for a reason of its own.
VALUES: dict[str, str] = {
    "model.name": "my-label",
    "model.source": "pretrained",
    "model.lora.target_modules": "[q_proj]",
    "model.lora.modules_to_save": "[]",
    "model.tiny.hidden_size": "128",  # a multiple of model.tiny.num_heads
    "model.revision": "main",
    "backend.name": "unsloth",
    "trainer.per_device_train_batch_size": "256",  # whole groups of rl.num_generations
    "rl.num_generations": "16",
    "rl.top_k": "5",
    "rl.importance_sampling_cap": "3.0",
    "rl.loss_type": "cispo",
    "rl.loss_aggregation": "grpo",
    "rl.advantage_estimator": "group_relative",
    "rl.importance_sampling_mode": "token_mask",
    # Refused under RL on the tiny model (vLLM loads a model folder); warned under SFT.
    "rollout.engine": "vllm",
    "rollout.vllm.lora_sync": "merged",
    "rollout.vllm.sleep": "false",
    "task.name": "mytask",
    "task.generator": "art_hydra.tasks.toy.digit_sum_examples",
    "task.path": "/data/train.jsonl",
    "task.split": "test",
    "task.columns.prompt": "question",
    "task.columns.answer": "solution",
    "task.columns.messages": "chat",
    "task.system_prompt": "'Be brief.'",
    "task.params": "{length: 4}",
    "task.reward._target_": "art_hydra.tasks.rewards.exact_match",
    "task.rewards": "[{_target_: art_hydra.tasks.rewards.exact_match}]",
    "task.allowed_modules": "[mypkg]",
    "checkpoint.dir": "ckpt",
    "logging.tensorboard": "false",
    "logging.report_to": "[none]",
    "logging.project": "my-project",
    "logging.trackers_dir": ".",
    "logging.progress_bar": "off",
    "objective.metric": "loss",
    "eval.fraction": "0.2",
    "eval.path": "/data/eval.jsonl",
    "eval.split": "test",
    "resume": "auto",
    "task.environment": "{_target_: art_hydra.tasks.tool_lookup.LookupEnv}",
    "task.tools": "[art_hydra.tasks.tool_lookup.lookup]",
    "task.tool_parser": "hermes",
    "model.chat_template": "tools",
}

#: Values for a string key whose VALUES entry a scenario already has (rl+vllm).
BACK_VALUES: dict[str, str] = {"rollout.engine": "torch", "model.lora.modules_to_save": "[lm_head]"}

#: The one advantage estimator registered: no other value exists to set.
ONLY_CHOICE = {"rl.advantage_estimator"}


def _other_value(key: str, current: Any, kind: Any) -> str:
    """A valid value of ``key`` other than ``current``, as an override spells it."""
    spelt = current.name if isinstance(current, enum.Enum) else str(current)
    if key in VALUES and VALUES[key] != spelt:
        return VALUES[key]
    if key in BACK_VALUES:  # the scenario already has VALUES[key]
        return BACK_VALUES[key]
    if isinstance(current, bool) or kind is bool:
        return str(not current).lower()
    if isinstance(current, enum.Enum):
        return next(m.name for m in type(current) if m != current)
    if isinstance(current, int):
        return str(current + 1)
    if isinstance(current, float):
        return str(current / 2 if current else 0.05)
    if current is None and "int" in str(kind):
        return "3"
    if current is None and "float" in str(kind):
        return "0.5"
    raise AssertionError(f"{key}: no value to set for {current!r} ({kind}); add one to VALUES")


KEYS = [(key, type_hints(cls)[name]) for key, cls, name in leaves()]


@pytest.fixture(scope="module")
def loader() -> Any:
    return make_loader()


@pytest.fixture(scope="module")
def bases(loader: Any) -> dict[str, DictConfig]:
    """Each scenario as composed without the key (the values the key is set against)."""
    found = {}
    for name, overrides in SCENARIOS.items():
        result = compose_and_check(loader, "config", overrides, RunMode.RUN)
        assert result.problems == [] and result.resolved is not None, (name, result.problems)
        found[name] = result.resolved
    return found


def _names(problem: Problem, key: str) -> bool:
    return problem.key == key or problem.key.startswith((f"{key}.", f"{key}["))


def verdict(loader: Any, base: list[str], key: str, value: str) -> tuple[str, list[Problem]]:
    """``refused``, ``warned``, ``read`` or ``silent`` for ``key=value`` over ``base``,
    with the problems that name the key; ``false warning`` for a key the run reads that
    a warning calls never read."""
    overrides = [o for o in base if not o.startswith(f"{key}=")] + [f"{key}={value}"]
    result = compose_and_check(loader, "config", overrides, RunMode.RUN)
    named = [p for p in result.problems if _names(p, key)]
    if any(p.severity == Severity.error for p in named):
        return "refused", named
    assert result.resolved is not None
    read = READ_WHEN[key](result.resolved)
    if named:
        never = read and any("never read" in p.reason for p in named)
        return ("false warning" if never else "warned"), named
    return ("read" if read else "silent"), named


def test_the_declaration_names_every_schema_key() -> None:
    assert sorted(READ_WHEN) == sorted(key for key, _ in KEYS)


@pytest.mark.parametrize(("key", "kind"), KEYS, ids=[key for key, _ in KEYS])
def test_every_key_is_read_warned_or_refused(
    loader: Any, bases: dict[str, DictConfig], key: str, kind: Any
) -> None:
    if key in ONLY_CHOICE:
        pytest.skip(f"{key} has one registered value: nothing else to set")
    wrong = []
    for scenario, base in SCENARIOS.items():
        value = _other_value(key, OmegaConf.select(bases[scenario], key), kind)
        found, named = verdict(loader, base, key, value)
        if found in ("silent", "false warning"):
            wrong.append(f"{scenario}: {key}={value} is {found}: {[p.reason for p in named]}")
    assert not wrong, "\n".join(wrong)


# ---- the rules the declaration asked for, at their edges ------------------------------


def _problems(loader: Any, *overrides: str) -> dict[str, Problem]:
    result = compose_and_check(loader, "config", list(overrides), RunMode.RUN)
    return {p.key: p for p in result.problems}


def test_evaluation_reads_the_rl_settings_it_generates_with_under_sft(loader: Any) -> None:
    """SFT's evaluation generates rl.max_completion_length tokens (eval.max_completion_length
    null) and samples with rl.top_k/top_p: none of them is "never read" there."""
    on = ["algorithm=sft", "eval.fraction=0.1", "eval.num_samples=2"]
    found = _problems(loader, *on, "rl.max_completion_length=9", "rl.top_k=5", "rl.top_p=0.9")
    assert found == {}
    found = _problems(loader, *on, "rl.temperature=0.5", "eval.max_completion_length=4")
    assert set(found) == {"rl.temperature"}  # evaluation samples at eval.temperature
    found = _problems(loader, "algorithm=sft", "eval.fraction=0.1", "rl.top_k=5")
    assert "rl.top_k" in found  # greedy only: no filter applies


def test_lora_on_the_tiny_model_without_its_head_cannot_learn(loader: Any) -> None:
    assert _problems(loader, "model.finetune=lora") == {}  # model=tiny saves lm_head
    found = _problems(loader, "model.finetune=lora", "model.lora.modules_to_save=[]")
    problem = found["model.lora.modules_to_save"]
    assert problem.severity == Severity.warning and "cannot learn" in problem.reason
    assert problem.fix.overrides() == ["model.lora.modules_to_save=[lm_head]"]
    assert problem.fix.alt is not None and problem.fix.alt.overrides() == ["model.finetune=full"]


def test_a_project_is_read_once_a_tracker_has_projects(loader: Any) -> None:
    assert "logging.project" in _problems(loader, "logging.project=mine")
    assert "logging.project" in _problems(
        loader, "logging.project=mine", "logging.report_to=[none]"
    )
    tracked = _problems(loader, "logging.project=mine", "logging.report_to=[tensorboard,trackio]")
    assert "logging.project" not in tracked


def test_collective_settings_are_read_once_several_ranks_are_launched(
    loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    overrides = ("distributed.backend=gloo", "distributed.timeout_s=60")
    assert {"distributed.backend", "distributed.timeout_s"} <= set(_problems(loader, *overrides))
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun starts each rank
    found = _problems(loader, *overrides, "trainer.per_device_train_batch_size=16")
    assert not {"distributed.backend", "distributed.timeout_s"} & set(found)


#: vLLM on a pretrained model (composition reads no files: a hub id stands for a folder).
VLLM_RUN = ("model=pretrained", "model.name=org/model", "rollout.engine=vllm")


def _warned(loader: Any, *overrides: str) -> dict[str, Problem]:
    """The "never read" warnings of the overrides, by key; no error among the problems."""
    result = compose_and_check(loader, "config", list(overrides), RunMode.RUN)
    assert not [p for p in result.problems if p.is_error], result.problems
    return {
        p.key: p
        for p in result.problems
        if p.severity == Severity.warning and "never read" in p.reason
    }


def test_vllm_settings_are_read_only_by_vllm(loader: Any) -> None:
    line = ("rollout.vllm.kv_cache_gib=2", "rollout.vllm.enforce_eager=true")
    found = _warned(loader, *line)
    assert set(found) == {"rollout.vllm.kv_cache_gib", "rollout.vllm.enforce_eager"}
    problem = found["rollout.vllm.kv_cache_gib"]
    assert "rollout.engine=torch" in problem.reason
    assert problem.fix.overrides() == ["rollout.vllm.kv_cache_gib=null"]
    assert _warned(loader, *line, *problem.fix.overrides()).keys() == {"rollout.vllm.enforce_eager"}
    assert _warned(loader, *VLLM_RUN, *line) == {}
    # A value that is the default does what the run does without it: nothing to warn.
    assert _warned(loader, "rollout.vllm.gpu_memory_utilization=0.3") == {}
    # A sweep that crosses the engine with them sets them on purpose.
    with sweeping(frozenset({"rollout.engine"})):
        assert _warned(loader, *line) == {}


def test_sft_reads_no_rollout_setting(loader: Any) -> None:
    found = _warned(loader, "algorithm=sft", "eval.fraction=0.1", *VLLM_RUN[2:])
    problem = found.pop("rollout.engine")
    assert found == {} and "built-in sampler" in problem.reason
    assert problem.fix.overrides() == ["rollout.engine=torch"]
    assert problem.fix.alt is not None and problem.fix.alt.overrides() == ["algorithm=rl"]
    assert _warned(loader, "algorithm=sft", "rollout.engine=torch") == {}
    found = _warned(loader, "algorithm=sft", *VLLM_RUN, "rollout.vllm.sleep=false")
    assert set(found) == {"rollout.engine", "rollout.vllm.sleep"}
    assert "rollout.engine" not in _warned(loader, *VLLM_RUN)


def test_the_importance_sampling_mode_is_read_only_with_a_cap(loader: Any) -> None:
    found = _warned(loader, "rl.importance_sampling_mode=sequence_mask")
    problem = found["rl.importance_sampling_mode"]
    assert "rl.importance_sampling_cap is null" in problem.reason
    applied = ("rl.importance_sampling_mode=sequence_mask", *problem.fix.overrides())
    assert problem.fix.overrides() == ["rl.importance_sampling_cap=2.0"]
    assert _warned(loader, *applied) == {}
    # Under SFT, the rl.* rule says it once.
    found = _warned(loader, "algorithm=sft", "rl.importance_sampling_mode=sequence_mask")
    assert "algorithm=sft" in found["rl.importance_sampling_mode"].reason


def test_vllm_settings_its_own_choices_skip(loader: Any) -> None:
    # vLLM's CPU engine reads the memory share too (the share of the machine it reserves).
    cpu = _warned(
        loader, *VLLM_RUN, "backend.device=cpu", "rollout.vllm.gpu_memory_utilization=0.5"
    )
    assert cpu == {}
    rank = "rollout.vllm.max_lora_rank=16"
    full = _warned(loader, *VLLM_RUN, "model.finetune=full", rank, "rollout.vllm.lora_sync=merged")
    assert set(full) == {"rollout.vllm.max_lora_rank", "rollout.vllm.lora_sync"}
    assert full["rollout.vllm.lora_sync"].fix.overrides() == ["model.finetune=lora"]
    merged = _warned(loader, *VLLM_RUN, rank, "rollout.vllm.lora_sync=merged")
    assert set(merged) == {"rollout.vllm.max_lora_rank"}
    assert merged["rollout.vllm.max_lora_rank"].fix.overrides() == [
        "rollout.vllm.max_lora_rank=null"
    ]
    assert _warned(loader, *VLLM_RUN, rank) == {}
