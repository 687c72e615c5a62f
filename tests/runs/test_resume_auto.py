"""resume=auto, sweep folders and default folder names: the verdicts, without training.

(The real runs and sweeps that exercise them are in tests/reliability/test_sweep_folders.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import problem_about
from omegaconf import OmegaConf

from art_hydra import ConfigValidationError, Kind, Severity, compose
from art_hydra.config.composition import compose_and_check
from art_hydra.config.problems import fix
from art_hydra.preflight import for_sweep, sweep_folder_problems, world_problems
from art_hydra.runs import run_identity
from art_hydra.runs.run_folder import (
    BROKEN,
    FINISHED,
    FRESH,
    RESTART,
    RESUME,
    auto_verdict,
    clear_unsaved_run,
    resume_mode,
    write_manifest,
    write_run_config,
)


def _checkpoint(run: Path, step: int) -> Path:
    """A checkpoint as the run writes it (its files, then the manifest)."""
    state = run / "checkpoints" / f"step-{step:06d}" / "trainer_state"
    state.mkdir(parents=True)
    (state / "state.json").write_text("{}")
    write_manifest(state.parent, step)
    return state.parent


def _records(run: Path, overrides: list[str]) -> None:
    """A run's records at its start (config and first metrics line), no checkpoint."""
    write_run_config(run, compose(overrides))
    run_identity.record(compose(overrides), run)  # as a run writes it at its start
    (run / "metrics.jsonl").write_text('{"step": 1}\n')


def _world(overrides: list[str], run: Path, sweep: bool = False) -> list:
    return world_problems(compose(overrides), run, sweep=sweep)


# ---- the setting ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "mode"),
    [
        ([], "false"),
        (["resume=true"], "true"),
        (["resume=false"], "false"),
        (["resume=auto"], "auto"),
        (["resume=True"], "true"),
        (["resume=False"], "false"),
    ],
)
def test_resume_takes_true_false_and_auto(given: list[str], mode: str) -> None:
    cfg = compose(given)
    assert cfg.resume == mode and resume_mode(cfg) == mode


def test_resume_refuses_other_values() -> None:
    with pytest.raises(ConfigValidationError) as refused:
        compose(["resume=maybe"])
    problem = problem_about(refused.value, "resume")
    assert problem.is_error and "auto" in problem.reason
    assert resume_mode({"resume": True}) == "true"  # a mapping not yet structured


# ---- what auto does in a folder -------------------------------------------------------


def test_auto_verdicts(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert auto_verdict(run, "checkpoints", 4) == (FRESH, None)  # no folder yet
    run.mkdir()
    assert auto_verdict(run, "checkpoints", 4) == (FRESH, None)  # an empty one
    _records(run, ["trainer.max_steps=4"])
    assert auto_verdict(run, "checkpoints", 4) == (RESTART, None)  # died before step 1's save
    _checkpoint(run, 2)
    assert auto_verdict(run, "checkpoints", 4) == (RESUME, 2)
    assert auto_verdict(run, "checkpoints", 2) == (FINISHED, 2)  # reached max_steps
    assert auto_verdict(run, "checkpoints", 1) == (FINISHED, 2)
    # A checkpoint that no longer verifies is neither resumed nor replaced.
    (run / "checkpoints" / "step-000002" / "trainer_state" / "state.json").write_text("{1}")
    assert auto_verdict(run, "checkpoints", 4) == (BROKEN, None)


def test_auto_reads_the_result_record_without_a_checkpoint(tmp_path: Path) -> None:
    run = tmp_path / "run"
    _records_dir = run
    _records_dir.mkdir()
    _records(run, ["trainer.max_steps=4"])
    (run / "result.json").write_text(json.dumps({"status": "done"}))
    assert auto_verdict(run, "checkpoints", 4) == (FINISHED, None)
    (run / "result.json").write_text(json.dumps({"status": "done", "steps": 4}))
    assert auto_verdict(run, "checkpoints", 4) == (FINISHED, 4)
    assert auto_verdict(run, "checkpoints", 8)[0] == RESTART  # max_steps raised: train
    for status in ("failed", "interrupted", "refused"):
        (run / "result.json").write_text(json.dumps({"status": status, "steps": 4}))
        assert auto_verdict(run, "checkpoints", 4)[0] == RESTART
    (run / "result.json").write_text("not json")
    assert auto_verdict(run, "checkpoints", 4)[0] == RESTART
    # A checkpoint decides over the record: raising max_steps continues a done run.
    (run / "result.json").write_text(json.dumps({"status": "done", "steps": 2}))
    _checkpoint(run, 2)
    assert auto_verdict(run, "checkpoints", 4) == (RESUME, 2)


def test_restart_clears_only_the_runs_own_records(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _records(run, [])
    (run / "art_hydra.log").write_text("kept: the log says what happened\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the run's")
    (run / "completions.jsonl").symlink_to(outside)  # a planted link: unlinked, not followed
    assert sorted(clear_unsaved_run(run)) == [
        "completions.jsonl",
        "metrics.jsonl",
        "run_config.yaml",
        "run_identity.json",
    ]
    assert outside.read_text() == "not the run's"
    assert sorted(p.name for p in run.iterdir()) == ["art_hydra.log"]


# ---- the world pre-flight -------------------------------------------------------------


def test_auto_passes_where_true_and_false_are_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    max4 = ["trainer.max_steps=4"]
    assert _world([*max4, "resume=auto"], run) == []  # no folder: a fresh run
    assert [p.key for p in _world([*max4, "resume=true"], run)] == ["resume"]
    run.mkdir()
    _records(run, max4)  # a run that died before its first checkpoint
    assert _world([*max4, "resume=auto"], run) == []
    assert [p.key for p in _world(max4, run)] == ["resume"]
    assert [p.key for p in _world([*max4, "resume=true"], run)] == ["resume"]
    _checkpoint(run, 2)  # a run stopped at step 2
    assert _world([*max4, "resume=auto"], run) == []
    assert [p.key for p in _world(max4, run)] == ["resume"]
    assert _world(["trainer.max_steps=2", "resume=auto"], run) == []  # finished: skipped


def test_auto_still_refuses_another_run(tmp_path: Path) -> None:
    """auto continues the same run only: a checkpoint written under other settings is
    refused as resume=true refuses it, and so is a finished one (never skipped as if it
    were this point's)."""
    run = tmp_path / "run"
    run.mkdir()
    _records(run, ["trainer.max_steps=4", "seed=1"])
    _checkpoint(run, 2)
    (seed,) = _world(["trainer.max_steps=4", "seed=2", "resume=auto"], run)
    assert (seed.key, seed.value, seed.fix.overrides()) == ("seed", 2, ["seed=1"])
    (finished,) = _world(["trainer.max_steps=2", "seed=2", "resume=auto"], run)
    assert finished.key == "seed"


def test_broken_checkpoints_under_auto_are_named(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _records(run, [])
    folder = _checkpoint(run, 2)
    (folder / "trainer_state" / "state.json").write_text("changed")
    (problem,) = _world(["resume=auto"], run)
    assert (problem.key, problem.value, problem.kind) == ("resume", "auto", Kind.world)
    assert "none of them intact" in problem.reason and "does not match" in problem.reason


def test_a_sweep_jobs_folder_fixes_name_the_sweep_folder(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    _records(run, [])
    _checkpoint(run, 2)
    for folder, overrides in ((run, []), (tmp_path / "none", ["resume=true"])):
        alone = _world(overrides, folder)
        swept = _world(overrides, folder, sweep=True)
        assert alone and len(alone) == len(swept)
        assert any("hydra.run.dir" in p.fix.render() for p in alone)
        for p in swept:
            assert "hydra.run.dir" not in p.fix.render(), p.fix.render()
            assert p.key != "hydra.run.dir"
    (held,) = _world([], run, sweep=True)
    assert held.fix.render().startswith("resume=auto (continue that run), or hydra.sweep.dir=")
    (run / "junk.txt").write_text("x")  # another file: a notice, named by the sweep's key
    notice, _ = _world([], run, sweep=True)
    assert (notice.key, notice.severity) == ("hydra.sweep.dir", Severity.warning)
    (run / "pyproject.toml").write_text("")  # a project: not a run folder
    (stray,) = _world([], run, sweep=True)
    assert (stray.key, stray.fix.render()) == (
        "hydra.sweep.dir",
        "hydra.sweep.dir=<a new folder> (replace <...>)",
    )


def test_for_sweep_keeps_a_plain_fix_and_rewrites_the_rest() -> None:
    from art_hydra.config.problems import Problem

    plain = Problem("seed", 3, "r", fix({"seed": 1}), Kind.world, Severity.error)
    assert for_sweep(plain) == plain
    text = Problem("hydra.run.dir", "x", "r", "hydra.run.dir=<a new folder>", Kind.world)
    assert for_sweep(text).fix == "hydra.sweep.dir=<a new folder>"
    assert for_sweep(text).key == "hydra.sweep.dir"


# ---- the sweep folder -------------------------------------------------------------------


def _master(*task: str, hydra: tuple[str, ...] = ("hydra.mode=MULTIRUN",)) -> object:
    """A sweep's master config as far as the sweep-folder check reads it."""
    resume = next((o.partition("=")[2] for o in task if o.startswith("resume=")), "false")
    return OmegaConf.create(
        {
            "resume": resume,
            "hydra": {
                "overrides": {"task": list(task), "hydra": list(hydra)},
                "sweeper": {"params": {}},
            },
        }
    )


def _sweep_folder(tmp_path: Path, *task: str, jobs: int = 2) -> Path:
    folder = tmp_path / "sweep"
    folder.mkdir()
    OmegaConf.save(_master(*task), folder / "multirun.yaml")
    for job in range(jobs):
        (folder / str(job)).mkdir()
    return folder


def test_a_fresh_or_empty_sweep_folder_passes(tmp_path: Path) -> None:
    assert sweep_folder_problems(tmp_path / "new", _master("seed=1,2")) == []
    (tmp_path / "empty").mkdir()
    assert sweep_folder_problems(tmp_path / "empty", _master("seed=1,2")) == []


def test_a_folder_holding_another_sweep_is_refused(tmp_path: Path) -> None:
    folder = _sweep_folder(tmp_path, "seed=1,2")
    for mode in ("false", "true", "auto"):
        (problem,) = sweep_folder_problems(folder, _master("seed=3,4", f"resume={mode}"))
        assert (problem.key, problem.value) == ("hydra.sweep.dir", str(folder))
        assert "another sweep" in problem.reason and "seed=3,4" in problem.reason
        assert problem.fix.render().startswith("hydra.sweep.dir=<a new folder>")
        assert "hydra.run.dir" not in problem.fix.render()
    # The launcher may change; a point's overrides may not (nor their order: it numbers them).
    (tmp_path / "b").mkdir()
    ordered = _sweep_folder(tmp_path / "b", "seed=1,2", "rl.temperature=0.5,1")
    swapped = _master("rl.temperature=0.5,1", "seed=1,2", "resume=auto")
    assert sweep_folder_problems(ordered, swapped)


def test_the_same_sweep_continues_with_auto_only(tmp_path: Path) -> None:
    folder = _sweep_folder(tmp_path, "seed=1,2")
    (again,) = sweep_folder_problems(folder, _master("seed=1,2"))
    assert again.key == "hydra.sweep.dir" and again.fix.overrides() == ["resume=auto"]
    assert "hydra.sweep.dir=<a new folder>" in again.fix.render()
    auto = _master("seed=1,2", "resume=auto", hydra=("hydra.mode=MULTIRUN",))
    assert sweep_folder_problems(folder, auto) == []
    assert sweep_folder_problems(folder, _master("seed=1,2"), resume_mode="auto") == []
    assert sweep_folder_problems(folder, _master("seed=1,2", "resume=true")) == []
    named = _master(
        "seed=1,2",
        "resume=auto",
        hydra=("hydra.mode=MULTIRUN", f"hydra.sweep.dir={folder}", "hydra/launcher=joblib"),
    )
    assert sweep_folder_problems(folder, named) == []
    # A sweep stopped before its first job started: nothing to mix, any resume passes.
    (folder / "0").rmdir(), (folder / "1").rmdir()
    assert sweep_folder_problems(folder, _master("seed=1,2")) == []


def test_a_folder_that_is_no_sweeps_is_refused(tmp_path: Path) -> None:
    stray = tmp_path / "project"
    stray.mkdir()
    (stray / "notes.txt").write_text("mine")
    (problem,) = sweep_folder_problems(stray, _master("seed=1,2", "resume=auto"))
    assert "no multirun.yaml" in problem.reason and "notes.txt" in problem.reason
    torn = _sweep_folder(tmp_path, "seed=1,2")
    (torn / "multirun.yaml").write_text("hydra: [unclosed")
    (problem,) = sweep_folder_problems(torn, _master("seed=1,2", "resume=auto"))
    assert "cannot be read" in problem.reason
    (torn / "multirun.yaml").unlink()
    (torn / "multirun.yaml").symlink_to(stray / "notes.txt")
    (problem,) = sweep_folder_problems(torn, _master("seed=1,2", "resume=auto"))
    assert "not a regular file" in problem.reason
    (problem,) = sweep_folder_problems(stray / "notes.txt", _master("seed=1,2"))
    assert "not a folder" in problem.reason


# ---- default folder names -----------------------------------------------------------------


def test_the_default_folders_are_fixed_within_a_process() -> None:
    """Hydra and art_hydra compose the config several times in one process (the CLI's
    check, then Hydra's own): each names the same folder, and a sweep's folder carries
    the same mark."""
    from hydra.types import RunMode

    from art_hydra.config.composition import CONFIG_NAME, make_loader
    from art_hydra.config.store import unique_name

    def folders(mode: RunMode) -> tuple[str, str]:
        result = compose_and_check(make_loader(), CONFIG_NAME, [], mode)
        assert result.hydra is not None
        return str(result.hydra.run.dir), str(result.hydra.sweep.dir)

    for run, sweep in (folders(RunMode.RUN), folders(RunMode.MULTIRUN), folders(RunMode.RUN)):
        assert run.endswith(f"-{unique_name()}") and sweep.endswith(f"-{unique_name()}")
        assert run.startswith("outputs/") and sweep.startswith("outputs/multirun/")


def test_two_processes_name_different_folders() -> None:
    code = (
        "from art_hydra.config.store import unique_name; "
        "assert unique_name() == unique_name(); print(unique_name())"
    )
    names = [
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        for _ in range(2)
    ]
    first, second = (p.stdout.strip() for p in names)
    assert first and second and first != second
