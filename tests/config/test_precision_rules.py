"""Precision keys at composition: pure float16 weights are refused, a master_weights=false
that changes nothing and an importance-sampling cap below 1 are warnings, and the model
presets that load bfloat16 train on float32 masters unless told otherwise."""

from __future__ import annotations

import pytest

from art_hydra import ConfigValidationError, Severity, compose


def _strict_problems(overrides: list[str]) -> list:
    """The warnings (made errors by strict=true) a config gives."""
    with pytest.raises(ConfigValidationError) as info:
        compose([*overrides, "strict=true"])
    return info.value.problems


@pytest.mark.parametrize(
    ("overrides", "why"),
    [
        (["model.finetune=lora"], "model.finetune=lora trains float32 adapters"),
        (["model.dtype=float32"], "model.dtype=float32 has no half weights"),
        (["model.dtype=bfloat16", "backend=unsloth"], "backend=unsloth manages"),
    ],
    ids=["lora", "float32", "unsloth"],
)
def test_master_weights_false_that_does_nothing_warns(overrides: list[str], why: str) -> None:
    problems = [
        p
        for p in _strict_problems([*overrides, "model.master_weights=false"])
        if p.key == "model.master_weights"
    ]
    assert len(problems) == 1 and why in problems[0].reason, problems
    assert problems[0].fix.overrides() == ["model.master_weights=true"]


def test_pure_bfloat16_full_finetuning_composes_quietly() -> None:
    """Asked for explicitly, it runs; the load-time warning measures what rounds away."""
    cfg = compose(["model.dtype=bfloat16", "model.master_weights=false", "strict=true"])
    assert cfg.model.master_weights is False


def test_a_float16_refusal_names_both_ways_out() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["model.dtype=float16", "model.master_weights=false"])
    (problem,) = [p for p in info.value.problems if p.key == "model.master_weights"]
    assert problem.severity == Severity.error
    assert problem.fix.overrides() == ["model.master_weights=true"]
    assert problem.fix.alt is not None and problem.fix.alt.overrides() == ["model.dtype=bfloat16"]


def test_an_importance_sampling_cap_below_one_warns() -> None:
    (problem,) = [
        p
        for p in _strict_problems(["rl.importance_sampling_cap=0.5"])
        if p.key == "rl.importance_sampling_cap"
    ]
    assert "below the weight of a token both sides agree on" in problem.reason
    assert compose(["rl.importance_sampling_cap=1"]).rl.importance_sampling_cap == 1


@pytest.mark.parametrize("preset", ["qwen2_5_0_5b_instruct", "llama3_2_1b_instruct"])
def test_bfloat16_presets_get_float32_masters_in_full_finetuning(preset: str) -> None:
    cfg = compose([f"model={preset}", "model.finetune=full"])
    assert cfg.model.dtype.name == "bfloat16" and cfg.model.master_weights is True
