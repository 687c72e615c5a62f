"""Right verdicts both ways: what works runs (with a warning if it looks wrong), and one
switch makes warnings fatal."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import problem_about

from art_hydra import ConfigValidationError, Kind, Severity, compose


@pytest.mark.parametrize(
    "overrides",
    [
        ["trainer.max_steps=10"],
        ["trainer.max_steps=1"],
        ["algorithm=sft", "trainer.max_steps=20"],
        ["trainer.max_steps=3", "checkpoint.every_steps=1000"],
    ],
)
def test_a_run_shorter_than_the_checkpoint_interval_is_fine(overrides: list[str]) -> None:
    """Its final checkpoint is written anyway."""
    assert compose(overrides).checkpoint.every_steps >= 1


def test_warnings_do_not_stop_the_run(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = compose(["trainer.warmup_steps=400", "rl.temperature=0.05", "rl.top_p=0.3"])
    assert cfg.trainer.warmup_steps == 400
    err = capsys.readouterr().err
    assert "The configuration runs, with 3 warnings" in err
    assert "trainer.warmup_steps = 400" in err and "never reaches" in err


def test_strict_makes_warnings_fatal() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["trainer.warmup_steps=400", "strict=true"])
    (problem,) = info.value.problems
    assert problem.key == "trainer.warmup_steps" and problem.severity == Severity.error


def test_yaml_booleans_for_the_progress_bar_are_accepted(tmp_path: Path) -> None:
    """YAML reads a bare `off` as false; it means off."""
    (tmp_path / "quiet").mkdir()
    (tmp_path / "quiet" / "yes.yaml").write_text(
        "# @package _global_\nlogging:\n  progress_bar: off\n"
    )
    cfg = compose(["+quiet=yes"], config_dir=str(tmp_path))
    assert cfg.logging.progress_bar == "off"
    assert compose(["logging.progress_bar=true"]).logging.progress_bar == "on"
    with pytest.raises(ConfigValidationError) as info:
        compose(["logging.progress_bar=loud"])
    problem = problem_about(info.value, "logging.progress_bar")
    assert (problem.value, problem.kind, problem.severity) == ("loud", Kind.bound, Severity.error)
    assert problem.fix.overrides() == ["logging.progress_bar=auto"]


def test_relative_config_dir_follows_the_current_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, lr in (("a", "0.25"), ("b", "0.5")):
        (tmp_path / name / "conf" / "opt").mkdir(parents=True)
        (tmp_path / name / "conf" / "opt" / "x.yaml").write_text(
            f"# @package _global_\ntrainer:\n  learning_rate: {lr}\n"
        )
    monkeypatch.chdir(tmp_path / "a")
    assert compose(["+opt=x"], config_dir="conf").trainer.learning_rate == 0.25
    monkeypatch.chdir(tmp_path / "b")
    assert compose(["+opt=x"], config_dir="conf").trainer.learning_rate == 0.5
