"""``rl.loss_aggregation`` on 2 CPU ranks (gloo): TRL's grpo and dr_grpo are each
process's own mean, which DDP averages; with the same number of completions on each
rank that average is the mean over the global batch, so two ranks give one process's
gradient on it (``grad_check.py``), as the default dapo does in ``test_data_parallel``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = pytest.mark.dist

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HERE = Path(__file__).resolve().parent


def _gradient(out: Path, ranks: int, aggregation: str) -> dict:
    """``grad_check.py``'s gradient of its fixed global batch, alone or on 2 ranks."""
    script = str(HERE / "grad_check.py")
    # The tree under test stays first (a worktree's art_hydra, not the installed one).
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    args = [script, str(out), f"rl.loss_aggregation={aggregation}"]
    launch = [TORCHRUN, "--standalone", f"--nproc_per_node={ranks}"] if ranks > 1 else []
    proc = subprocess.run(
        [*launch, *([sys.executable] if ranks == 1 else []), *args],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    return load_file(out)


@pytest.mark.parametrize("aggregation", ["grpo", "dr_grpo"])
def test_two_ranks_average_their_own_means(tmp_path: Path, aggregation: str) -> None:
    one = _gradient(tmp_path / "one.safetensors", 1, aggregation)
    two = _gradient(tmp_path / "two.safetensors", 2, aggregation)
    assert one.keys() == two.keys() and one
    worst = max((one[k] - two[k]).abs().max().item() for k in one)
    scale = max(one[k].abs().max().item() for k in one)
    assert worst <= 1e-6 * max(scale, 1.0), (worst, scale)
    # The key reached the loss: dapo's gradient of the same batch is another.
    dapo = _gradient(tmp_path / "dapo.safetensors", 1, "dapo")
    assert max((one[k] - dapo[k]).abs().max().item() for k in one) > 1e-3 * scale
