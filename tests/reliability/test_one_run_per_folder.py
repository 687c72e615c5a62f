"""One run per folder: a second run, or a resume, into a folder whose run is still
training is refused at once, naming the process that holds it."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from conftest import output_of, run_cli, start_cli, wait_for_steps
from test_interrupts import FAULT

pytestmark = pytest.mark.slow


def test_a_busy_folder_is_refused_and_freed_when_its_run_ends(tmp_path: Path) -> None:
    run = tmp_path / "run"
    long_run = [*FAULT, "trainer.max_steps=2000"]
    proc = start_cli(*long_run, f"hydra.run.dir={run}", cwd=tmp_path)
    try:
        wait_for_steps(run, 2, proc)
        for extra in ([], ["resume=true"]):
            second = run_cli(*long_run, *extra, f"hydra.run.dir={run}", cwd=tmp_path)
            out = output_of(second)
            assert second.returncode == 1
            assert f"is in use by process {proc.pid} on host" in out, out
            assert "Traceback" not in out
        assert proc.poll() is None  # the running job was not disturbed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)
    assert proc.returncode == 143
    resumed = run_cli(*FAULT, "resume=true", f"hydra.run.dir={run}", cwd=tmp_path)
    assert resumed.returncode == 0, output_of(resumed)  # the folder is free again


def test_a_lock_left_by_a_killed_run_is_free(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_cli(*FAULT, "checkpoint.every_steps=1", f"hydra.run.dir={run}", cwd=tmp_path)
    wait_for_steps(run, 2, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    assert (run / "run.lock").exists()
    again = run_cli(
        *FAULT, "checkpoint.every_steps=1", "resume=true", f"hydra.run.dir={run}", cwd=tmp_path
    )
    assert again.returncode == 0, output_of(again)
