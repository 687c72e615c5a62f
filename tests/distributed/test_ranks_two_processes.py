"""The rank coordinator (art_hydra/engine/ranks.py) on two real gloo ranks: the token count
summed and shared, the metrics combined, a stop seen by one rank agreed by both, the
producers' states gathered in rank order, and both barriers passed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HERE = Path(__file__).resolve().parent


def test_the_process_group_coordinator_agrees_across_two_ranks(tmp_path: Path) -> None:
    out = tmp_path / "ranks.json"
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", str(HERE / "ranks_check.py"), str(out)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(out.read_text())
    assert found["size"] == 2
    assert found["denominators"] == [15.0, 15.0]  # (10 + 20) tokens / 2 ranks
    assert found["reward_mean"] == pytest.approx(0.5) and found["loss"] == pytest.approx(1.5)
    assert found["stopping_before"] is False and found["stopping_after"] is True
    assert found["gathered"] == [{"rank": 0}, {"rank": 1}]
