"""Checks of a multi-rank run, decided at composition from the launch (torchrun's
WORLD_SIZE, or the launcher a sweep is about to use) before any process group forms."""

from __future__ import annotations

import pytest
from conftest import problem_about

from art_hydra import compose
from art_hydra.config.composition import check
from art_hydra.config.launch_plan import planned_launch
from art_hydra.config.problems import ConfigValidationError, Kind, Severity, errors, warnings_of


def _problems(overrides: list[str]) -> list:
    cfg = compose(["dry_run=true"])  # a valid base; the overrides are applied by check()
    for item in overrides:
        key, _, value = item.partition("=")
        cfg_value = None if value == "null" else (int(value) if value.isdigit() else value)
        parent, _, leaf = key.rpartition(".")
        cfg[parent][leaf] = cfg_value
    return check(cfg)[1]


def test_under_torchrun_the_world_size_is_the_launchs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert compose().distributed.world_size == 2
    with pytest.raises(ConfigValidationError) as info:
        compose(["trainer.per_device_train_batch_size=12"])
    problem = problem_about(info.value, "trainer.per_device_train_batch_size")
    assert (problem.kind, problem.severity) == (Kind.rule, Severity.error)
    assert problem.fix.overrides() == ["trainer.per_device_train_batch_size=16"]
    assert "each of the 2 ranks samples whole groups of 8" in problem.reason


def test_a_planned_world_size_must_match_the_launch(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigValidationError) as info:
        compose(["distributed.world_size=4"])
    problem = problem_about(info.value, "distributed.world_size")
    assert (problem.kind, problem.severity) == (Kind.rule, Severity.error)
    assert problem.fix.overrides() == ["distributed.world_size=2"]


def test_a_sweep_launchers_ranks_count_as_the_launch() -> None:
    with planned_launch(8):
        problems = _problems(["distributed.world_size=2"])
    problem = problem_about(errors(problems), "distributed.world_size")
    assert problem.fix.overrides() == ["distributed.world_size=8"]


def test_a_plan_without_a_launch_is_a_warning_not_an_error() -> None:
    problems = _problems(["distributed.world_size=2"])
    assert not errors(problems)
    (warning,) = [p for p in warnings_of(problems) if p.key == "distributed.world_size"]
    assert "nothing launched them: this runs as one process" in warning.reason


@pytest.mark.parametrize(
    ("overrides", "key", "fix"),
    [
        (["backend=unsloth", "backend.device=cuda"], "backend", "backend=torch"),
        (
            ["backend.device=cpu", "distributed.backend=nccl"],
            "distributed.backend",
            "distributed.backend=gloo",
        ),
    ],
)
def test_what_ranks_cannot_form_is_refused(
    monkeypatch: pytest.MonkeyPatch, overrides: list[str], key: str, fix: str
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigValidationError) as info:
        compose(overrides)
    problem = problem_about(info.value, key)
    assert (problem.kind, problem.severity) == (Kind.rule, Severity.error)
    assert problem.fix.overrides() == [fix]
