"""What stops a whole sweep before its first trial or job, through the real CLI: an
Optuna study told to search the other way than the objective, and a SLURM launcher on a
machine that has no SLURM."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import output_of, report_entries, run_cli

OPTUNA = ["-m", "hydra/sweeper=optuna", "hydra.sweeper.n_trials=1", "dry_run=true"]
SPACE = "rl.temperature=interval(0.7,1.2)"


def _study(tmp_path: Path, *extra: str) -> tuple[int, str]:
    proc = run_cli(*OPTUNA, SPACE, *extra, f"hydra.sweep.dir={tmp_path / 'study'}", cwd=tmp_path)
    return proc.returncode, output_of(proc)


def test_a_study_told_to_maximise_a_loss_is_warned_and_refused_under_strict(
    tmp_path: Path,
) -> None:
    """A direction the command line sets is the user's choice: the study runs as told,
    with a warning naming the override that agrees with the objective; strict=true
    refuses it before anything is written."""
    told = ("algorithm=sft", "hydra.sweeper.direction=maximize")
    code, out = _study(tmp_path, *told)
    assert code == 0, out
    assert "hydra.sweeper.direction = maximize" in out and "Traceback" not in out
    code, out = _study(tmp_path, *told, "strict=true")
    assert code == 1, out
    assert report_entries(out) == [
        (
            "hydra.sweeper.direction",
            "maximize",
            "hydra.sweeper.direction=minimize (search the objective's way), or "
            "objective.direction=maximize (if the objective is what is wrong)",
        )
    ]
    assert "The study was not started." in out
    assert not (tmp_path / "study").exists()
    # Its first fix, pasted after the command line, starts the study without a word.
    first = report_entries(out)[0][2].split(" (")[0]
    code, out = _study(tmp_path, *told, "strict=true", first)
    assert code == 0, out
    assert "hydra.sweeper.direction =" not in out


def test_optunas_own_default_direction_is_named_as_such(tmp_path: Path) -> None:
    """hydra/sweeper=optuna minimises unless told: RL's reward_mean is to be maximised."""
    code, out = _study(tmp_path)
    assert code == 1, out
    ((key, value, fix),) = report_entries(out)
    assert (key, value) == ("hydra.sweeper.direction", "minimize")
    assert fix.startswith("hydra.sweeper.direction=maximize")
    assert "the sweeper's own default" in out


@pytest.mark.parametrize(
    "agreeing",
    [
        ["hydra.sweeper.direction=maximize"],
        ["objective.direction=minimize"],  # the sweeper's default, now the objective's way
        ["hydra.sweeper.direction=minimize", "objective.metric=loss"],
        # The points' objectives differ in direction: each is ranked on its own.
        ["hydra.sweeper.direction=maximize", "algorithm=choice(rl,sft)"],
    ],
)
def test_a_study_whose_direction_agrees_with_the_objective_starts(
    tmp_path: Path, agreeing: list[str]
) -> None:
    code, out = _study(tmp_path, *agreeing)
    assert code == 0, out
    assert "dry run" in out and "hydra.sweeper.direction =" not in out


def _without_srun(tmp_path: Path) -> dict[str, str]:
    """A PATH that has Python's tools but no srun (this machine has none anyway)."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    kept = [d for d in dirs if not (Path(d) / "srun").exists()]
    return {"PATH": os.pathsep.join(kept)}


def _with_srun(tmp_path: Path) -> dict[str, str]:
    tools = tmp_path / "slurm-bin"
    tools.mkdir()
    srun = tools / "srun"
    srun.write_text("#!/bin/sh\nexit 0\n")
    srun.chmod(0o755)
    return {"PATH": os.pathsep.join([str(tools), os.environ.get("PATH", "")])}


def test_a_slurm_sweep_without_srun_is_refused_before_anything_starts(tmp_path: Path) -> None:
    proc = run_cli(
        "-m", "hydra/launcher=slurm", "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path, env=_without_srun(tmp_path),
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert report_entries(out) == [
        (
            "hydra/launcher",
            "slurm",
            "hydra/launcher=slurm_local (the same multi-rank jobs as local processes on this "
            "machine, to try the sweep), or run the sweep on a SLURM login node, where srun "
            "is on PATH",
        )
    ]
    assert "No job was launched." in out and "Traceback" not in out
    assert not (tmp_path / "sweep").exists() and not (tmp_path / "outputs").exists()


def test_a_slurm_dry_run_without_srun_is_told_and_goes_on(tmp_path: Path) -> None:
    """A dry run launches nothing: checking a SLURM sweep's plan on a laptop is fine."""
    proc = run_cli(
        "-m", "hydra/launcher=slurm", "seed=1,2", "dry_run=true",
        cwd=tmp_path, env=_without_srun(tmp_path),
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "hydra/launcher = slurm" in out and "pre-flight passed for 2 of 2" in out


def test_a_slurm_sweep_with_srun_is_not_refused_for_it(tmp_path: Path) -> None:
    proc = run_cli(
        "-m", "hydra/launcher=slurm", "seed=1,2", "dry_run=true",
        cwd=tmp_path, env=_with_srun(tmp_path),
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "hydra/launcher = slurm" not in out and "pre-flight passed for 2 of 2" in out


def test_a_search_space_given_as_a_mapping_is_told_the_overrides_that_work(
    tmp_path: Path,
) -> None:
    """Hydra cannot merge ``hydra.sweeper.params={...}`` into the null it holds; it is no
    unknown key (it was called one, with a fix repeating it): the fix writes each dimension
    as its own override, and pasted after the command line it starts the study."""
    given = ("hydra.sweeper.direction=maximize", 'hydra.sweeper.params={rl.top_k: "range(2,4)"}')
    code, out = _study(tmp_path, *given)
    assert code == 1, out
    ((key, _, fix),) = report_entries(out)
    assert (key, fix) == ("hydra.sweeper.params", "rl.top_k=range(2,4) ~hydra.sweeper.params")
    assert "not a key" not in out and "Traceback" not in out
    code, out = _study(tmp_path, *given, *fix.split())
    assert code == 0, out
    assert "rl.top_k=" in out
