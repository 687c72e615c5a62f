"""What Hydra accepts silently or leaves to blow up later: deletions, unknown keys,
interpolations (resolved before any check reads them), types, and fixes that fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_hydra import ConfigValidationError, Kind, compose

CONF = Path(__file__).resolve().parents[2] / "conf"


def _problems(overrides: list[str]) -> dict[str, list]:
    with pytest.raises(ConfigValidationError) as info:
        compose(overrides)
    found: dict[str, list] = {}
    for p in info.value.problems:
        found.setdefault(p.key, []).append(p)
    return found


def test_deleting_schema_fields_is_reported_by_name() -> None:
    found = _problems(["~seed", "~trainer"])
    assert set(found) == {"seed", "trainer"}
    assert found["trainer"][0].kind == Kind.deleted
    assert found["trainer"][0].fix.render() == "drop the '~trainer' override"


def test_misspelt_added_key_is_found_with_the_real_one() -> None:
    (problem,) = _problems(["+trainer.lerning_rate=1e-5"])["trainer.lerning_rate"]
    assert problem.kind == Kind.unknown_key
    assert problem.fix.overrides() == ["trainer.learning_rate=1e-05"]


def test_broken_interpolation_inside_a_list_is_found() -> None:
    found = _problems(["model.lora.target_modules=[q_proj,${oc.env:ART_HYDRA_NO_SUCH_VAR}]"])
    assert found["model.lora.target_modules.1"][0].kind == Kind.interpolation


@pytest.mark.parametrize(
    "override",
    [
        "trainer.learning_rate=inf",
        "trainer.weight_decay=nan",
        "rl.temperature=inf",
        "queue.input_timeout_s=inf",
        "trainer.max_grad_norm=${oc.decode:'nan'}",
        "rl.temperature=${oc.env:ART_HYDRA_TEST_NAN}",
    ],
)
def test_nan_and_infinity_are_rejected_once_even_through_interpolations(
    override: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ART_HYDRA_TEST_NAN", "nan")
    key = override.split("=")[0]
    found = _problems([override])
    assert [p.reason.split(":")[0] for p in found[key]] == ["must be a finite number"]


def test_interpolated_values_are_checked_by_every_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ART_HYDRA_TEST_GAS", "2")
    found = _problems(["trainer.gradient_accumulation_steps=${oc.env:ART_HYDRA_TEST_GAS}"])
    assert "RL cannot accumulate" in found["trainer.gradient_accumulation_steps"][0].reason


def test_hydra_runtime_values_outside_a_job_are_named() -> None:
    """A single run has no job number: ${hydra:job.num} would fail inside the job."""
    found = _problems(["seed=${hydra:job.num}"])
    assert "Hydra's runtime config" in found["seed"][0].reason


def test_resolved_values_are_what_the_run_gets() -> None:
    # (checkpoint.dir must stay relative to the run folder: an absolute one is refused.)
    cfg = compose(["checkpoint.dir=ck-${hydra:job.name}", "task.name=${task.generator}"])
    assert cfg.checkpoint.dir == "ck-art_hydra"
    assert cfg.task.name == "art_hydra.tasks.toy.reverse_examples"


def test_empty_names_are_rejected() -> None:
    assert "model.name" in _problems(["model=qwen2_5_0_5b_instruct", "model.name="])


def test_wrong_types_and_choices_get_schema_fixes() -> None:
    assert _problems(["backend.device=CPU"])["backend.device"][0].fix.overrides() == [
        "backend.device=cpu"
    ]
    (lr,) = _problems(["trainer.learning_rate=abc"])["trainer.learning_rate"]
    assert lr.kind == Kind.type and lr.fix.overrides() == ["trainer.learning_rate=1e-05"]


def test_fixes_that_really_fix() -> None:
    fix = _problems(["task.params.newkey=1"])["task.params.newkey"][0].fix.render()
    assert fix == "+task.params.newkey=1"
    compose([fix])  # the suggested override composes
    heads = _problems(["model.tiny.hidden_size=3"])["model.tiny.num_heads"][0].fix
    compose(heads.overrides())  # no loop: the suggestion is valid
    group = _problems(["+experiment=tiny_sft_reverse"])["+experiment"][0].fix
    assert group.overrides() == ["experiment=tiny_sft_reverse"]
    compose(group.overrides())
