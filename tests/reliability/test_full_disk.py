"""A disk that fills up mid-run: a real ENOSPC from a 3 MiB tmpfs mounted in a user and
mount namespace (skipped where the machine allows no such namespace). The run stops with
one message naming what failed, every checkpoint on disk stays whole, and once there is
room the run resumes and finishes."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ART_HYDRA
from test_interrupts import FAULT

pytestmark = pytest.mark.slow


def _namespaces_work() -> bool:
    probe = "mount -t tmpfs -o size=1m none /mnt 2>/dev/null && echo ok"
    try:
        out = subprocess.run(
            ["unshare", "-rm", "sh", "-c", probe], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return out.stdout.strip() == "ok"


@pytest.mark.skipif(not _namespaces_work(), reason="no user/mount namespaces here")
def test_a_full_disk_stops_the_run_cleanly_and_it_resumes_once_there_is_room(
    tmp_path: Path,
) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    run = disk / "run"
    args = [*FAULT, "checkpoint.every_steps=2", "checkpoint.keep_last=1", f"hydra.run.dir={run}"]
    command = " ".join(shlex.quote(a) for a in [ART_HYDRA, *args])
    verify = (
        f'{shlex.quote(sys.executable)} -c "from art_hydra.runs.run_folder import '
        f"checkpoint_folders, verify; print('WHOLE', [verify(p) for p in "
        f"checkpoint_folders(__import__('pathlib')"
        f".Path('{run}/checkpoints'))])\""
    )
    script = (
        f"mount -t tmpfs -o size=3m none {disk} && cd {tmp_path} && "
        f"{{ {command}; echo FIRST_EXIT=$?; }} && {verify} && "
        f"mount -o remount,size=64m {disk} && "
        f"{{ {command} resume=true; echo SECOND_EXIT=$?; }} && "
        f"wc -l < {run}/metrics.jsonl"
    )
    proc = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=600
    )
    out = proc.stdout + proc.stderr
    assert "FIRST_EXIT=1" in out, out
    assert "No space left on device" in out
    assert "Traceback" not in out
    assert "WHOLE [None" in out  # at least one checkpoint, and every one verifies
    assert "SECOND_EXIT=0" in out, out
    assert proc.stdout.strip().splitlines()[-1].strip() == "30"  # every step, once
