"""Each run and sweep its own folder, and a stopped sweep continued with one command
(resume=auto): real processes, real signals, real training of the tiny model."""

from __future__ import annotations

import json
import shlex
import shutil
import signal
import time
from pathlib import Path

import pytest
from conftest import output_of, report_entries, run_cli, start_cli
from omegaconf import OmegaConf

from art_hydra.preflight import sweep_folder_problems
from art_hydra.runs.run_folder import checkpoint_folders

pytestmark = pytest.mark.slow

QUICK = [
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.is_file() else 0


def test_two_runs_started_together_get_their_own_folders(tmp_path: Path) -> None:
    procs = [start_cli(*QUICK, "trainer.max_steps=1", cwd=tmp_path) for _ in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    folders = sorted(tmp_path.glob("outputs/*/*/metrics.jsonl"))
    assert len(folders) == 2, folders  # neither run was refused for the other's folder
    assert all(_lines(path) == 1 for path in folders)


def _wait_for_job(root: Path, job: str, steps: int, proc, timeout: float = 240) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = list(root.glob(f"outputs/multirun/*/*/{job}/metrics.jsonl"))
        if found and _lines(found[0]) >= steps:
            return found[0].parent.parent
        assert proc.poll() is None, output_of_popen(proc)
        time.sleep(0.02)
    raise AssertionError(f"job {job} logged no {steps} steps within {timeout}s")


def output_of_popen(proc) -> str:
    out, err = proc.communicate()
    return out + err


def test_ctrl_c_in_a_sweep_prints_the_command_that_continues_it(tmp_path: Path) -> None:
    """Job 0 finishes, job 1 is stopped by Ctrl-C after a step, job 2 never starts; the
    printed command skips 0, resumes 1 and starts 2, and a second time skips them all."""
    steps = 8
    sweep_args = ["-m", *QUICK, f"trainer.max_steps={steps}", "rl.temperature=0.7,1.0,1.2"]
    proc = start_cli(*sweep_args, cwd=tmp_path)
    sweep = _wait_for_job(tmp_path, "1", 1, proc)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert not (sweep / "2").exists()  # never started
    stopped_at = len((sweep / "1" / "metrics.jsonl").read_text().splitlines())
    assert 1 <= stopped_at < steps
    command = shlex.split(err.split("Continue the whole sweep with:")[1].strip().splitlines()[0])
    assert command[:2] == ["art-hydra", "-m"]
    assert "rl.temperature=0.7,1.0,1.2" in command and f"trainer.max_steps={steps}" in command
    assert command[-2:] == ["resume=auto", f"hydra.sweep.dir={sweep.resolve()}"]
    done = (sweep / "0" / "metrics.jsonl").read_text()

    continued = run_cli(*command[1:], cwd=tmp_path, timeout=600)
    out = output_of(continued)
    assert continued.returncode == 0, out
    assert f"{sweep.resolve() / '0'} already finished ({steps} steps); skipped" in out
    assert (sweep / "0" / "metrics.jsonl").read_text() == done  # not trained again
    assert not (sweep / "0" / "resumes.jsonl").exists()
    (resumed,) = [json.loads(x) for x in (sweep / "1" / "resumes.jsonl").read_text().splitlines()]
    assert resumed["from_step"] == stopped_at
    assert not (sweep / "2" / "resumes.jsonl").exists()  # started afresh
    for job in "012":
        assert _lines(sweep / job / "metrics.jsonl") == steps
        assert checkpoint_folders(sweep / job / "checkpoints")[-1].name == f"step-{steps:06d}"
    assert not list(tmp_path.glob("outputs/multirun/*/*/3"))

    again = run_cli(*command[1:], cwd=tmp_path, timeout=600)
    assert again.returncode == 0, output_of(again)
    assert output_of(again).count("already finished") == 3

    # The sweeper's check of the folder, on the multirun.yaml a real sweep wrote: the
    # same sweep continues (resume and the folder aside); another one is refused.
    saved = OmegaConf.load(sweep / "multirun.yaml")
    assert sweep_folder_problems(sweep, saved) == []
    saved.resume = "false"
    (again_fresh,) = sweep_folder_problems(sweep, saved)
    assert again_fresh.fix.overrides() == ["resume=auto"]
    saved.hydra.overrides.task = [*QUICK, f"trainer.max_steps={steps}", "rl.temperature=0.5,2"]
    saved.resume = "auto"
    (other,) = sweep_folder_problems(sweep, saved)
    assert other.key == "hydra.sweep.dir" and "another sweep" in other.reason

    # Without resume=auto the sweep is refused before any job starts, once, for its folder
    # (a sweep ignores hydra.run.dir), with resume=auto as the fix.
    fresh = run_cli(*[c for c in command[1:] if c != "resume=auto"], cwd=tmp_path)
    assert fresh.returncode == 1
    entries = report_entries(output_of(fresh))
    assert [key for key, _, _ in entries] == ["hydra.sweep.dir"], entries
    assert (
        entries[0][2].startswith("resume=auto")
        and "hydra.sweep.dir=<a new folder>" in (entries[0][2])
    )
    assert "hydra.run.dir" not in output_of(fresh)


def test_auto_starts_afresh_where_a_run_died_before_its_first_checkpoint(tmp_path: Path) -> None:
    """A run killed before its first checkpoint left records and nothing to resume:
    resume=false and resume=true are refused there, resume=auto replaces those records
    with a fresh run's (the metrics are the new run's alone, not appended)."""
    run = tmp_path / "run"
    args = [*QUICK, "trainer.max_steps=2", f"hydra.run.dir={run}"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, output_of(first)
    for folder in checkpoint_folders(run / "checkpoints"):  # as if killed before saving
        for path in sorted(folder.rglob("*"), reverse=True):
            path.rmdir() if path.is_dir() else path.unlink()
        folder.rmdir()
    (run / "checkpoints").rmdir()
    record = json.loads((run / "result.json").read_text())  # what a killed run leaves
    record.update(status="running", finished=None)
    (run / "result.json").write_text(json.dumps(record))
    assert _lines(run / "metrics.jsonl") == 2
    assert run_cli(*args, cwd=tmp_path).returncode == 1
    assert run_cli(*args, "resume=true", cwd=tmp_path).returncode == 1
    again = run_cli(*args, "resume=auto", cwd=tmp_path)
    assert again.returncode == 0, output_of(again)
    assert _lines(run / "metrics.jsonl") == 2  # the new run's two steps, nothing appended
    assert not (run / "resumes.jsonl").exists()
    assert checkpoint_folders(run / "checkpoints")[-1].name == "step-000002"


def test_auto_skips_a_run_that_finished_and_kept_no_checkpoint(tmp_path: Path) -> None:
    """A finished point whose checkpoints were deleted (space) has only its record."""
    run = tmp_path / "run"
    args = [*QUICK, "trainer.max_steps=2", f"hydra.run.dir={run}"]
    first = run_cli(*args, cwd=tmp_path)
    assert first.returncode == 0, output_of(first)
    shutil.rmtree(run / "checkpoints")
    again = run_cli(*args, "resume=auto", cwd=tmp_path)
    assert again.returncode == 0, output_of(again)
    assert "already finished" in output_of(again)
    assert _lines(run / "metrics.jsonl") == 2
