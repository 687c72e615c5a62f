"""Inputs found by review: deletions, Hydra's resolvers, lists, -cp, NaN, odd fixes."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import output_of

from art_hydra import ConfigValidationError, compose

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
    assert found["trainer"][0].fix == "drop the '~trainer' override"


def test_hydra_resolvers_are_accepted(cli, tmp_path: Path) -> None:
    proc = cli(
        "checkpoint.dir=${hydra:runtime.output_dir}/ck", "task.name=${now:%H}", "dry_run=true"
    )
    assert proc.returncode == 0, output_of(proc)


def test_broken_interpolation_inside_a_list_is_found() -> None:
    found = _problems(["model.lora.target_modules=[q_proj,${oc.env:ART_HYDRA_NO_SUCH_VAR}]"])
    assert "model.lora.target_modules[1]" in found


def test_absolute_config_path_is_prechecked(cli, tmp_path: Path) -> None:
    proc = cli("-cp", str(CONF), "trainer.gradient_accumulation_steps=4")
    assert proc.returncode == 1
    assert "RL cannot accumulate gradients" in output_of(proc)
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "override",
    [
        "trainer.learning_rate=inf",
        "trainer.weight_decay=nan",
        "rl.temperature=inf",
        "queue.input_timeout_s=inf",
    ],
)
def test_nan_and_infinity_are_rejected_once(override: str) -> None:
    key = override.split("=")[0]
    found = _problems([override])
    assert [p.reason.split(":")[0] for p in found[key]] == ["must be a finite number"]


def test_empty_names_are_rejected() -> None:
    assert "model.name" in _problems(["model=qwen2_5_0_5b_instruct", "model.name="])


def test_fixes_that_really_fix() -> None:
    assert _problems(["backend.device=CPU"])["backend.device"][0].fix == "backend.device=cpu"
    fix = _problems(["task.params.newkey=1"])["task.params.newkey"][0].fix
    assert fix == "+task.params.newkey=1"
    compose([fix])  # the suggested override composes
    heads = _problems(["model.tiny.hidden_size=3"])["model.tiny.num_heads"][0].fix
    compose(heads.split())  # no loop: the suggestion is valid
    group = _problems(["+experiment=tiny_sft_reverse"])["+experiment"][0].fix
    assert group.startswith("experiment=tiny_sft_reverse") and group.endswith("list)")


def test_skip_invalid_with_no_valid_point_fails(cli, tmp_path: Path) -> None:
    proc = cli("-m", "trainer.gradient_accumulation_steps=2,3", "hydra.sweeper.skip_invalid=true")
    assert proc.returncode == 1
    assert "No point is valid; no job was launched." in output_of(proc)
    assert not (tmp_path / "outputs").exists()
