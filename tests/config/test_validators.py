"""Each built-in validator, failing and passing, through the compose API."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_hydra import ConfigValidationError, compose, validate
from art_hydra.config.registry import registered_validators

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
        ["rl.max_completion_length=60"],
        "rl.max_completion_length",
        "longer than model.max_seq_length=64",
        ["rl.max_completion_length=48"],
    ),
    (
        ["algorithm=sft", "sft.max_length=65"],
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
    (["trainer.max_steps=0"], "trainer.max_steps", "at least 1", ["trainer.max_steps=60"]),
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
        ["backend=unsloth", "backend.device=cpu"],
        "backend.device",
        "CUDA GPU",
        ["backend=unsloth", "backend.device=auto"],
    ),
    (
        ["trainer.max_steps=40"],
        "checkpoint.every_steps",
        "larger than the run",
        ["trainer.max_steps=40", "checkpoint.every_steps=40"],
    ),
    (
        ["checkpoint.every_steps=0", "checkpoint.keep_last=0"],
        "checkpoint.keep_last",
        "at least 1",
        ["checkpoint.every_steps=0", "checkpoint.keep_last=1"],
    ),
    (
        ["trainer.warmup_steps=300"],
        "trainer.warmup_steps",
        "never reach",
        ["trainer.warmup_steps=299"],
    ),
    (["rl.temperature=0"], "rl.temperature", "must be > 0", ["rl.temperature=0.7"]),
    (["rl.top_p=1.5"], "rl.top_p", "(0, 1]", ["rl.top_p=0.95"]),
    (["rl.beta=-0.1"], "rl.beta", ">= 0", ["rl.beta=0.04"]),
    (["trainer.max_grad_norm=-1"], "trainer.max_grad_norm", ">= 0", ["trainer.max_grad_norm=0"]),
    (["trainer.adam_beta2=1.0"], "trainer.adam_beta2", "[0, 1)", ["trainer.adam_beta2=0.95"]),
    (["model.tiny.num_heads=3"], "model.tiny.num_heads", "even size", ["model.tiny.num_heads=8"]),
    (["model.tiny.num_heads=64"], "model.tiny.num_heads", "even size", ["model.tiny.num_heads=16"]),
    (
        ["queue.result_timeout_s=0"],
        "queue.result_timeout_s",
        "bounded",
        ["queue.result_timeout_s=0.5"],
    ),
    (
        ["queue.input_timeout_s=inf"],
        "queue.input_timeout_s",
        "finite",
        ["queue.input_timeout_s=30"],
    ),
    (
        ["task=jsonl", "model=qwen2_5_0_5b_instruct"],
        "task.path",
        "needs the JSONL file",
        None,
    ),  # passing case built with a real file below
    (
        ["task=jsonl", "model=qwen2_5_0_5b_instruct", "task.path=/no/such/file.jsonl"],
        "task.path",
        "no such file",
        None,
    ),
    (
        ["task.reward._target_=exact_match"],
        "task.reward._target_",
        "dotted path",
        ["task.reward._target_=my_pkg.rewards.exact_match"],
    ),
    (
        ["model.finetune=lora", "model.lora.target_modules=[]", "model.lora.modules_to_save=[]"],
        "model.lora.target_modules",
        "nothing would train",
        [
            "model.finetune=lora",
            "model.lora.modules_to_save=[lm_head]",
            "model.lora.target_modules=[]",
        ],
    ),
    (["logging.every_steps=0"], "logging.every_steps", "at least 1", ["logging.every_steps=5"]),
]


@pytest.mark.parametrize(
    ("bad", "key", "reason", "good"), CASES, ids=[" ".join(c[0]) for c in CASES]
)
def test_validator_fails_then_passes(
    bad: list[str], key: str, reason: str, good: list[str] | None, tmp_path: Path
) -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(bad)
    found = [p for p in info.value.problems if p.key == key]
    assert found, f"no problem on {key}: {info.value}"
    assert any(reason in p.reason for p in found), found
    assert all(p.fix for p in found)
    if good is None:
        data = tmp_path / "data.jsonl"
        data.write_text('{"prompt": "2+2=", "answer": "4"}\n')
        good = ["task=jsonl", "model=qwen2_5_0_5b_instruct", f"task.path={data}"]
    cfg = compose(good)
    assert cfg.model.name


def test_founding_rule_fix_keeps_the_effective_batch() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["trainer.gradient_accumulation_steps=4", "trainer.per_device_train_batch_size=16"])
    (problem,) = [p for p in info.value.problems if p.key == "trainer.gradient_accumulation_steps"]
    assert problem.value == 4
    assert problem.fix.startswith(
        "trainer.gradient_accumulation_steps=1 trainer.per_device_train_batch_size=64"
    )
    # The suggested fix itself is a valid configuration.
    fixed = problem.fix.split(" (")[0].split()
    fixed_cfg = compose(["trainer.per_device_train_batch_size=16", *fixed])
    assert fixed_cfg.trainer.per_device_train_batch_size == 64


def test_all_problems_are_reported_together() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["rl.epsilon=2", "rl.temperature=0", "trainer.learning_rate=-1"])
    keys = {p.key for p in info.value.problems}
    assert {"rl.epsilon", "rl.temperature", "trainer.learning_rate"} <= keys


def test_every_builtin_validator_is_registered() -> None:
    names = {name.rsplit(".", 1)[-1] for name in registered_validators()}
    assert {
        "rl_rejects_gradient_accumulation",
        "rl_groups_fill_the_batch",
        "sequences_fit_the_model",
        "model_and_backend_agree",
    } <= names


def test_validate_handles_hand_built_configs() -> None:
    cfg = compose()
    plain = dict(cfg)  # a plain mapping of sections, as a user might build
    from omegaconf import OmegaConf

    container = OmegaConf.to_container(cfg)
    assert validate(container).trainer.learning_rate == cfg.trainer.learning_rate
    container["trainer"]["gradient_accumulation_steps"] = 2
    container["trainer"]["lr"] = 1
    with pytest.raises(ConfigValidationError) as info:
        validate(container)
    keys = {p.key for p in info.value.problems}
    assert keys == {"trainer.gradient_accumulation_steps", "trainer.lr"}
    assert plain  # sanity: composing gave a non-empty config
