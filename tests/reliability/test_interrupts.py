"""SIGINT and SIGTERM keep the work: the step in progress finishes, a checkpoint is
written, the metrics are flushed, and the printed command resumes to the very weights
an uninterrupted run reaches (real processes, real signals)."""

from __future__ import annotations

import shlex
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import ART_HYDRA, run_cli, start_cli, wait_for_steps
from safetensors.torch import load_file

from art_hydra.run_folder import checkpoint_folders, verify

pytestmark = pytest.mark.slow

FAULT = [
    "trainer.max_steps=30",
    "trainer.per_device_train_batch_size=32",
    "checkpoint.every_steps=10",
    "checkpoint.keep_last=5",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]
FINAL = "checkpoints/step-000030/model.safetensors"


def same_weights(a: Path, b: Path) -> bool:
    left, right = load_file(a), load_file(b)
    return left.keys() == right.keys() and all(torch.equal(left[k], right[k]) for k in left)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cwd = tmp_path_factory.mktemp("whole")
    proc = run_cli(*FAULT, "hydra.run.dir=run", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return cwd / "run"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_signal_saves_the_last_step_and_prints_the_resume_command(
    tmp_path: Path, uninterrupted: Path, signum: int, code: int
) -> None:
    run = tmp_path / "run"
    proc = start_cli(*FAULT, f"hydra.run.dir={run}", cwd=tmp_path)
    wait_for_steps(run, 4, proc)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert "Traceback" not in err
    steps = len((run / "metrics.jsonl").read_text().splitlines())
    assert f"stopped by {signal.Signals(signum).name}" in err and f"after step {steps} of 30" in err
    newest = checkpoint_folders(run / "checkpoints")[-1]
    assert newest.name == f"step-{steps:06d}" and verify(newest) is None
    command = shlex.split(err.split("Resume with:")[1].strip().splitlines()[0])
    assert command[0] == "art-hydra" and "resume=true" in command
    resumed = run_cli(*command[1:], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 30
    assert same_weights(run / FINAL, uninterrupted / FINAL)


def test_a_second_ctrl_c_exits_at_once_leaving_only_whole_checkpoints(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_cli(*FAULT, "checkpoint.every_steps=1", f"hydra.run.dir={run}", cwd=tmp_path)
    wait_for_steps(run, 3, proc)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    started = time.monotonic()
    _, err = proc.communicate(timeout=30)
    assert time.monotonic() - started < 5
    assert proc.returncode == 130
    assert "second interrupt" in err and "Traceback" not in err
    assert all(verify(folder) is None for folder in checkpoint_folders(run / "checkpoints"))


def test_the_resume_command_runs_from_any_directory(tmp_path: Path) -> None:
    """The printed command names the run folder absolutely."""
    run = tmp_path / "run"
    proc = start_cli(*FAULT, "hydra.run.dir=run", cwd=tmp_path)
    wait_for_steps(run, 2, proc)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    command = err.split("Resume with:")[1].strip().splitlines()[0]
    assert f"hydra.run.dir={run.resolve()}" in command
    assert Path(ART_HYDRA).name == "art-hydra"
