"""Cross-field rules and single-field bounds, failing and passing, through the compose API."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from art_hydra import ConfigValidationError, Fix, Severity, compose, validate
from art_hydra.config.validator_registry import registered_validators

# (overrides that break exactly one rule, key the report must name, words of its reason,
#  overrides of the same shape that pass)
CASES = [
    (
        ["trainer.gradient_accumulation_steps=2"],
        "trainer.gradient_accumulation_steps",
        "RL cannot accumulate",
        ["algorithm=sft", "trainer.gradient_accumulation_steps=2"],
    ),
    (
        ["algorithm=sft", "trainer.gradient_accumulation_steps=0"],
        "trainer.gradient_accumulation_steps",
        "at least 1",
        ["algorithm=sft", "trainer.gradient_accumulation_steps=1"],
    ),
    (
        ["trainer.per_device_train_batch_size=12"],
        "trainer.per_device_train_batch_size",
        "not a multiple of rl.num_generations=8",
        ["trainer.per_device_train_batch_size=16"],
    ),
    (["rl.num_generations=1"], "rl.num_generations", "at least 2", ["rl.num_generations=2"]),
    (
        ["model.max_seq_length=64", "rl.max_completion_length=60"],
        "rl.max_completion_length",
        "longer than model.max_seq_length=64",
        ["rl.max_completion_length=48"],
    ),
    (
        ["algorithm=sft", "model.max_seq_length=64", "sft.max_length=65"],
        "sft.max_length",
        "longer than model.max_seq_length",
        ["algorithm=sft", "sft.max_length=64"],
    ),
    (
        ["trainer.learning_rate=0"],
        "trainer.learning_rate",
        "must be > 0",
        ["trainer.learning_rate=1e-6"],
    ),
    (["trainer.max_steps=0"], "trainer.max_steps", "at least 1", ["trainer.max_steps=1"]),
    (
        ["trainer.per_device_train_batch_size=0"],
        "trainer.per_device_train_batch_size",
        "at least 1",
        ["trainer.per_device_train_batch_size=8"],
    ),
    (
        ["model=qwen2_5_0_5b_instruct", "model.lora.r=0"],
        "model.lora.r",
        "at least 1",
        ["model=qwen2_5_0_5b_instruct", "model.lora.r=1"],
    ),
    (["rl.epsilon=1.0"], "rl.epsilon", "(0, 1)", ["rl.epsilon=0.99"]),
    (["rl.epsilon=0"], "rl.epsilon", "(0, 1)", ["rl.epsilon=0.01"]),
    (["rl.epsilon_high=-0.1"], "rl.epsilon_high", "must be > 0", ["rl.epsilon_high=0.28"]),
    (
        ["model=qwen2_5_0_5b_instruct", "model.load_in_4bit=true"],
        "model.load_in_4bit",
        "needs the Unsloth backend",
        ["model=qwen2_5_0_5b_instruct", "model.load_in_4bit=true", "backend=unsloth"],
    ),
    (
        ["model.load_in_4bit=true", "backend=unsloth"],
        "model.load_in_4bit",
        "tiny model",
        ["backend=unsloth"],
    ),
    (
        ["checkpoint.every_steps=0", "checkpoint.keep_last=0"],
        "checkpoint.keep_last",
        "at least 1",
        ["checkpoint.every_steps=0", "checkpoint.keep_last=1"],
    ),
    (["rl.temperature=0"], "rl.temperature", "must be > 0", ["rl.temperature=0.7"]),
    (["rl.top_p=1.5"], "rl.top_p", "(0, 1]", ["rl.top_p=0.95"]),
    (["rl.top_k=1"], "rl.top_k", "greedy decoding", ["rl.top_k=2"]),
    (["rl.beta=-0.1"], "rl.beta", ">= 0", ["rl.beta=0.04"]),
    (["trainer.max_grad_norm=-1"], "trainer.max_grad_norm", ">= 0", ["trainer.max_grad_norm=0"]),
    (["trainer.adam_beta2=1.0"], "trainer.adam_beta2", "[0, 1)", ["trainer.adam_beta2=0.95"]),
    (["model.tiny.num_heads=3"], "model.tiny.num_heads", "even size", ["model.tiny.num_heads=8"]),
    (["model.tiny.num_heads=64"], "model.tiny.num_heads", "even size", ["model.tiny.num_heads=16"]),
    (
        ["timeouts.step_s=0"],
        "timeouts.step_s",
        "bounded",
        ["timeouts.step_s=0.5"],
    ),
    (
        ["queue.input_timeout_s=inf"],
        "queue.input_timeout_s",
        "finite",
        ["queue.input_timeout_s=30"],
    ),
    (
        ["queue.input_timeout_s=1e10"],
        "queue.input_timeout_s",
        "threading.TIMEOUT_MAX",
        ["queue.input_timeout_s=86400"],
    ),
    (["seed=18446744073709551616"], "seed", "64-bit", ["seed=18446744073709551615"]),
    (
        ["task=jsonl", "model=qwen2_5_0_5b_instruct"],
        "task.path",
        "needs the JSONL file",
        ["task=jsonl", "model=qwen2_5_0_5b_instruct", "task.path=data.jsonl"],
    ),
    (
        ["task.reward._target_=exact_match"],
        "task.reward._target_",
        "dotted path",
        ["task.reward._target_=art_hydra.tasks.rewards.exact_match"],
    ),
    (
        ["model.finetune=lora", "model.lora.target_modules=[]"],
        "model.lora.target_modules",
        "peft would silently pick",
        ["model.finetune=lora", "model.lora.target_modules=[q_proj]"],
    ),
    (["logging.every_steps=0"], "logging.every_steps", "at least 1", ["logging.every_steps=5"]),
    (
        ["trainer.adam_epsilon=1e-50"],
        "trainer.adam_epsilon",
        "0 in float32",
        ["trainer.adam_epsilon=1e-30"],
    ),
    (["rl.temperature=1e-300"], "rl.temperature", "0 in float32", ["rl.temperature=0.5"]),
    (
        ["model.dtype=float16", "model.master_weights=false"],
        "model.master_weights",
        "trains only on float32 master weights",
        ["model.dtype=bfloat16", "model.master_weights=false"],
    ),
    (
        ["rl.importance_sampling_cap=0"],
        "rl.importance_sampling_cap",
        "must be > 0",
        ["rl.importance_sampling_cap=3"],
    ),
    (
        ["trainer.learning_rate=1e39"],
        "trainer.learning_rate",
        "infinite in float32",
        ["trainer.learning_rate=1"],
    ),
]


def _problems_of(overrides: list[str]) -> list:
    with pytest.raises(ConfigValidationError) as info:
        compose(overrides)
    return info.value.problems


@pytest.mark.parametrize(
    ("bad", "key", "reason", "good"), CASES, ids=[" ".join(c[0]) for c in CASES]
)
def test_rule_fails_then_passes(bad: list[str], key: str, reason: str, good: list[str]) -> None:
    found = [p for p in _problems_of(bad) if p.key == key]
    assert found, f"no problem on {key}"
    assert any(reason in p.reason for p in found), found
    assert all(p.severity == Severity.error for p in found)
    assert compose(good).model.name


@pytest.mark.parametrize(
    ("bad", "key", "reason", "good"), CASES, ids=[" ".join(c[0]) for c in CASES]
)
def test_each_fix_is_an_override_that_fixes(
    bad: list[str], key: str, reason: str, good: list[str]
) -> None:
    """A structured fix applied as overrides removes the problem it was given for."""
    for problem in [p for p in _problems_of(bad) if p.key == key]:
        assert isinstance(problem.fix, Fix)
        if not problem.fix.sets or problem.fix.has_placeholder:
            continue  # an instruction, or a path only the user knows, not overrides
        after = [*bad, *problem.fix.overrides()]
        try:
            compose(after)
        except ConfigValidationError as err:
            assert not [p for p in err.problems if p.key == key and p.reason == problem.reason]


def test_founding_rule_fix_keeps_the_effective_batch() -> None:
    (problem,) = [
        p
        for p in _problems_of(
            ["trainer.gradient_accumulation_steps=4", "trainer.per_device_train_batch_size=16"]
        )
        if p.key == "trainer.gradient_accumulation_steps"
    ]
    assert problem.value == 4
    assert problem.fix.overrides() == [
        "trainer.gradient_accumulation_steps=1",
        "trainer.per_device_train_batch_size=64",
    ]
    fixed = compose(["trainer.per_device_train_batch_size=16", *problem.fix.overrides()])
    assert fixed.trainer.per_device_train_batch_size == 64


def test_bound_fixes_read_the_schema_default() -> None:
    (problem,) = _problems_of(["trainer.adam_epsilon=-1"])
    assert problem.fix.sets == (("trainer.adam_epsilon", 1e-8),)
    assert problem.fix.render() == "trainer.adam_epsilon=1e-08 (the default)"


def test_all_problems_are_reported_together() -> None:
    problems = _problems_of(["rl.epsilon=2", "rl.temperature=0", "trainer.learning_rate=-1"])
    assert {p.key for p in problems} >= {"rl.epsilon", "rl.temperature", "trainer.learning_rate"}


def test_a_bad_value_is_reported_once_and_does_not_crash_other_rules() -> None:
    """num_generations=0 fails its bound; the batch-divisibility rule must not divide by it."""
    problems = _problems_of(["rl.num_generations=0"])
    assert [p.key for p in problems] == ["rl.num_generations"]


def test_bounds_of_an_unused_section_do_not_apply() -> None:
    """An SFT run never reads rl.*; a bad RL value there cannot stop it."""
    assert compose(["algorithm=sft", "rl.num_generations=1", "rl.top_k=1"]).rl.num_generations == 1
    assert compose(["model.lora.r=0"]).model.finetune.name == "full"  # the tiny model trains fully


def test_every_builtin_rule_is_registered() -> None:
    names = {name.rsplit(".", 1)[-1] for name in registered_validators()}
    assert {
        "rl_rejects_gradient_accumulation",
        "rl_groups_fill_the_batch",
        "sequences_fit_the_model",
        "model_and_backend_agree",
        "sampling_can_differ",
        "task_names_its_sources",
    } <= names


def test_validate_handles_hand_built_mappings() -> None:
    container = OmegaConf.to_container(compose())
    assert validate(container).trainer.learning_rate == 1e-3
    container["trainer"]["gradient_accumulation_steps"] = 2
    container["trainer"]["lr"] = 1
    with pytest.raises(ConfigValidationError) as info:
        validate(container)
    assert {p.key for p in info.value.problems} == {
        "trainer.gradient_accumulation_steps",
        "trainer.lr",
    }


def test_jsonl_path_is_composition_only_until_the_world_is_checked(tmp_path: Path) -> None:
    """compose() checks the config alone: a missing file is the world pre-flight's."""
    cfg = compose(["task=jsonl", "model=qwen2_5_0_5b_instruct", f"task.path={tmp_path}/none.jsonl"])
    assert cfg.task.path.endswith("none.jsonl")
