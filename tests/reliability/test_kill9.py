"""kill -9 at random moments (many of them in the middle of a checkpoint write or a
pruning), then resume, until the run is done: the weights end bitwise identical to an
uninterrupted run's. Set ART_HYDRA_KILL_CYCLES for a longer campaign."""

from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

import pytest
from conftest import run_cli, start_cli, wait_for_steps
from test_interrupts import FAULT, FINAL, same_weights

from art_hydra.runs.run_folder import checkpoint_folders

pytestmark = pytest.mark.slow

#: Every step checkpointed and pruned, so kills land in writes and deletions often.
BUSY = [*FAULT, "checkpoint.every_steps=1", "checkpoint.keep_last=2"]


def test_random_kill_9s_then_resume_end_bitwise_identical(tmp_path: Path) -> None:
    whole = run_cli(*BUSY, "hydra.run.dir=whole", cwd=tmp_path)
    assert whole.returncode == 0, whole.stderr
    cycles = int(os.environ.get("ART_HYDRA_KILL_CYCLES", "4"))
    rng = random.Random(0)
    run = tmp_path / "run"
    killed = 0
    resume: list[str] = []
    while True:
        proc = start_cli(*BUSY, *resume, f"hydra.run.dir={run}", cwd=tmp_path)
        if killed < cycles:
            if not resume:  # the first kill after the first checkpoint: something to resume
                wait_for_steps(run, 2, proc)
            time.sleep(rng.uniform(0.0, 0.6))
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
                killed += 1
                resume = ["resume=true"]
                assert checkpoint_folders(run / "checkpoints"), "nothing left to resume"
                continue
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        if len((run / "metrics.jsonl").read_text().splitlines()) == 30:
            break
        resume = ["resume=true"]
    assert killed == cycles
    assert same_weights(run / FINAL, tmp_path / "whole" / FINAL)
