"""A run writes inside its own folder only, and a sweep keeps its records straight.

Each test is an attack from issue 15 written down: a checkpoint folder pointed outside the
run, ``/`` or a project folder as the run folder, links planted under the names of the
run's own files, a file slipped into a checkpoint, a job launched into a folder another
run holds. The assertion is always on the victim: it is unchanged.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest
from conftest import output_of, report_entries, run_cli, start_cli, wait_for_steps
from safetensors.torch import load_file, save_file

from art_hydra import compose
from art_hydra.engine.metrics import MetricsLog, _truncate_after
from art_hydra.runs.run_folder import (
    RunLock,
    UnsafePath,
    claim,
    latest_intact,
    lock_holder,
    record_resume,
    verify,
    write_manifest,
)

#: A short run of the tiny model that writes no TensorBoard, plot or progress bar.
SHORT = [
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=16",
    "checkpoint.every_steps=1",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]
VICTIM_TEXT = "the victim's own data\n"


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "victim.txt"
    victim.write_text(VICTIM_TEXT)
    return victim


# ---- composition and pre-flight (no training) --------------------------------------


@pytest.mark.parametrize("where", ["absolute", "../victim", "a/../../victim", ".hydra"])
def test_a_checkpoint_dir_outside_the_run_folder_is_refused_at_composition(
    cli, tmp_path: Path, where: str
) -> None:
    value = str(tmp_path / "victim") if where == "absolute" else where
    proc = cli(f"checkpoint.dir={value}", "hydra.run.dir=run", *SHORT)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert f"checkpoint.dir = {value}" in out and "fix: checkpoint.dir=checkpoints" in out
    assert "Traceback" not in out
    assert not (tmp_path / "victim").exists() and not (tmp_path / "run").exists()


def test_root_home_a_file_and_a_project_folder_are_refused_as_run_folders(
    cli, tmp_path: Path
) -> None:
    project = tmp_path / "project"
    (project / ".git").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[project]\n")
    (project / "notes.txt").write_text("mine\n")
    a_file = _victim(tmp_path)
    for folder, why in [
        ("/", "is the file system's root"),
        (str(Path.home()), "is the home directory"),
        (str(a_file), "exists and is not a folder"),
        (str(project), "looks like a project, not a run folder (it holds .git, pyproject.toml)"),
    ]:
        proc = cli(f"hydra.run.dir={folder}", "dry_run=true")
        out = output_of(proc)
        assert proc.returncode == 1, out
        assert f"hydra.run.dir = {folder}" in out and why in out, out
        assert "hydra.run.dir=<a new folder>" in out
    assert sorted(p.name for p in project.iterdir()) == [".git", "notes.txt", "pyproject.toml"]
    assert a_file.read_text() == VICTIM_TEXT


def test_a_sweep_point_into_a_project_folder_is_refused_before_any_job(cli, tmp_path: Path) -> None:
    sweep = tmp_path / "sweep"
    (tmp_path / "project1").mkdir()
    (tmp_path / "project1" / "notes.txt").write_text("mine\n")
    (tmp_path / "project1" / "setup.py").write_text("")
    subdir = "hydra.sweep.subdir=../project${hydra.job.num}"
    proc = cli("-m", "seed=1,2", f"hydra.sweep.dir={sweep}", subdir, "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Point #1" in out and "looks like a project, not a run folder (it holds setup.py)" in out
    assert "hydra.sweep.dir=<a new folder>" in out


def test_a_sweep_folder_holding_other_files_is_refused_before_any_point(
    cli, tmp_path: Path
) -> None:
    sweep = tmp_path / "sweep"
    (sweep / "1").mkdir(parents=True)
    (sweep / "1" / "notes.txt").write_text("mine\n")
    proc = cli("-m", "seed=1,2", f"hydra.sweep.dir={sweep}", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.sweep.dir"]
    assert "no multirun.yaml" in out
    assert "Point #" not in out


def test_a_planted_lock_link_is_refused_and_its_target_is_unchanged(cli, tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.lock").symlink_to(victim)
    with pytest.raises(UnsafePath, match=r"run\.lock is a symbolic link"):
        RunLock(run).acquire()
    assert lock_holder(run) is None  # the holder is never read through the link
    proc = cli(f"hydra.run.dir={run}", *SHORT)
    out = output_of(proc)
    assert proc.returncode == 1 and "run.lock as a symbolic link" in out, out
    assert victim.read_text() == VICTIM_TEXT


def test_record_files_are_never_written_through_a_link(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    run = tmp_path / "run"
    run.mkdir()
    (run / "resumes.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePath, match=r"resumes\.jsonl is a symbolic link"):
        record_resume(run, 2, [])
    (run / "metrics.jsonl").symlink_to(victim)
    logging_cfg = compose(SHORT).logging
    with pytest.raises(UnsafePath, match=r"metrics\.jsonl is a symbolic link"):
        MetricsLog(run, logging_cfg, 2)
    (run / "metrics.jsonl").unlink()
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    # The temp file of a rewrite, planted as a link: replaced, the victim untouched.
    (run / f".metrics.jsonl.{os.getpid()}.tmp").symlink_to(victim)
    _truncate_after(run / "metrics.jsonl", 1)
    assert (run / "metrics.jsonl").read_text() == '{"step": 1}\n'
    (run / "completions.jsonl").symlink_to(victim)
    with pytest.raises(UnsafePath, match=r"completions\.jsonl is a symbolic link"):
        MetricsLog(run, logging_cfg, 2, resume_step=1)
    assert victim.read_text() == VICTIM_TEXT


def test_a_fifo_planted_as_a_record_file_is_refused_without_blocking(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    os.mkfifo(run / "resumes.jsonl")  # a writer opening it would wait for a reader forever
    with pytest.raises(UnsafePath, match="FIFO"):
        record_resume(run, 2, [])
    os.mkfifo(run / "run.lock")
    with pytest.raises(UnsafePath, match="not a regular file"):
        RunLock(run).acquire()


def test_a_checkpoint_holding_a_file_its_manifest_does_not_list_does_not_verify(
    tmp_path: Path,
) -> None:
    root = tmp_path / "checkpoints"
    for step in (1, 2):
        folder = root / f"step-{step:06d}"
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_text(f"weights {step}")
        write_manifest(folder, step)
    extra = root / "step-000002" / "extra.safetensors"
    extra.write_text("planted")
    assert verify(root / "step-000002") == (
        f"{extra} is not listed in its manifest (added after the checkpoint was written); "
        "it would be loaded with the checkpoint"
    )
    extra.unlink()
    (root / "step-000002" / "extra.safetensors").symlink_to(
        root / "step-000001" / "model.safetensors"
    )
    path, skipped = latest_intact(root)
    assert path == root / "step-000001" and "is not listed in its manifest" in skipped[0]


# ---- real runs ---------------------------------------------------------------------


@pytest.mark.slow
def test_links_in_a_resumed_run_folder_are_refused_and_victims_unchanged(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = run_cli(*SHORT, f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)
    victim = _victim(tmp_path)
    for name in ("metrics.jsonl", "resumes.jsonl"):
        saved = tmp_path / f"{name}.saved"
        if (run / name).exists():
            (run / name).rename(saved)
        (run / name).symlink_to(victim)
        proc = run_cli(
            *SHORT, "trainer.max_steps=3", "resume=true", f"hydra.run.dir={run}", cwd=tmp_path
        )
        out = output_of(proc)
        assert proc.returncode == 1, out
        assert f"holds {name} as a symbolic link" in out and "Traceback" not in out
        assert victim.read_text() == VICTIM_TEXT
        (run / name).unlink()
        if saved.exists():
            saved.rename(run / name)


@pytest.mark.slow
def test_checkpoint_cleanup_deletes_only_its_own_leftovers(tmp_path: Path) -> None:
    """Stale-entry cleanup never deletes what the run did not create, nor follows a link."""
    victim = tmp_path / "victim"
    victim.mkdir()
    for name in (".tmp-x", ".trash-x", ".tmp-step-000001-1"):
        (victim / name).mkdir()
    run = tmp_path / "run"
    checkpoints = run / "checkpoints"
    checkpoints.mkdir(parents=True)
    claim(run, ["checkpoints"])  # a run's folder (killed while pruning), not another tool's
    (checkpoints / ".tmp-x").mkdir()  # not a name this code gives: not its own
    (checkpoints / ".trash-notes").write_text("mine\n")
    (checkpoints / ".tmp-step-000009-1").symlink_to(victim)  # its name, but a link
    (checkpoints / ".trash-step-000009-1").mkdir()  # a killed pruner's: removed
    proc = run_cli(*SHORT, f"hydra.run.dir={run}", cwd=tmp_path)
    assert proc.returncode == 0, output_of(proc)
    assert sorted(p.name for p in victim.iterdir()) == [".tmp-step-000001-1", ".tmp-x", ".trash-x"]
    assert sorted(p.name for p in checkpoints.iterdir()) == [
        ".tmp-step-000009-1",
        ".tmp-x",
        ".trash-notes",
        "step-000001",
        "step-000002",
    ]
    # A checkpoint folder that is itself a link is refused, never written through.
    moved = tmp_path / "elsewhere"
    shutil.move(checkpoints, moved)
    checkpoints.symlink_to(victim)
    again = run_cli(
        *SHORT, "trainer.max_steps=3", "resume=true", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert again.returncode == 1 and "holds checkpoints as a symbolic link" in output_of(again)
    assert sorted(p.name for p in victim.iterdir()) == [".tmp-step-000001-1", ".tmp-x", ".trash-x"]


@pytest.mark.slow
def test_a_planted_weights_file_is_never_loaded_on_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = run_cli(*SHORT, "checkpoint.keep_last=2", f"hydra.run.dir={run}", cwd=tmp_path)
    assert first.returncode == 0, output_of(first)
    newest = run / "checkpoints" / "step-000002"
    weights = load_file(newest / "model.safetensors")
    save_file({k: v + 100.0 for k, v in weights.items()}, newest / "zz-planted.safetensors")
    proc = run_cli(
        *SHORT,
        "checkpoint.keep_last=2",
        "trainer.max_steps=3",
        "resume=true",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert f"{newest / 'zz-planted.safetensors'} is not listed in its manifest" in out
    assert "resumed from" in out and "step-000001 (step 1)" in out


@pytest.mark.slow
def test_a_job_refused_for_a_busy_folder_leaves_its_record_alone(tmp_path: Path) -> None:
    """Hydra writes a job's record before the job runs; a job refused for a folder whose
    lock another run holds must leave that run's .hydra/ and log exactly as they were.
    (A relative -cp is resolved as Hydra resolves it and checked like any other run.)"""
    run = tmp_path / "run"
    fast = [s for s in SHORT if not s.startswith("trainer.max_steps")]
    proc = start_cli(
        *fast, "trainer.max_steps=2000", "seed=1", f"hydra.run.dir={run}", cwd=tmp_path
    )
    try:
        wait_for_steps(run, 1, proc)
        record = {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()}
        log = (run / "art_hydra.log").read_bytes()
        second = run_cli(
            "-cp",
            "conf",
            *fast,
            "trainer.max_steps=2000",
            "seed=3",
            f"hydra.run.dir={run}",
            cwd=tmp_path,
        )
        out = output_of(second)
        assert second.returncode == 1, out
        assert f"is in use by process {proc.pid}" in out
        assert {p.name: p.read_bytes() for p in (run / ".hydra").iterdir()} == record
        assert b"seed=1" in record["overrides.yaml"]
        assert (run / "art_hydra.log").read_bytes()[: len(log)] == log
        assert b"seed=3" not in (run / "art_hydra.log").read_bytes()
        assert not list(run.glob(".hydra-pending-*"))
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)


@pytest.mark.slow
def test_each_sweep_job_records_its_own_point_and_leaves_no_pending_record(
    tmp_path: Path,
) -> None:
    sweep = tmp_path / "sweep"
    proc = run_cli(
        "-m", "seed=1,2", *SHORT, "trainer.max_steps=1", f"hydra.sweep.dir={sweep}", cwd=tmp_path
    )
    assert proc.returncode == 0, output_of(proc)
    for job, seed in (("0", 1), ("1", 2)):
        assert f"seed={seed}" in (sweep / job / ".hydra" / "overrides.yaml").read_text()
        assert not list((sweep / job).glob(".hydra-pending-*"))
