"""Evaluation on two ranks: each evaluates its slice of the held-out prompts, the
figures are combined over both, and rank 0 writes them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import output_of

pytestmark = pytest.mark.dist

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
QUIET = ["logging.progress_bar=off", "logging.tensorboard=false", "logging.plot=false"]


def test_two_ranks_evaluate_every_held_out_prompt_once(tmp_path: Path) -> None:
    cmd = [
        TORCHRUN,
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "art_hydra",
        "trainer.per_device_train_batch_size=16",
        "trainer.max_steps=2",
        "eval.fraction=0.125",
        "eval.num_samples=1",
        "hydra.run.dir=run",
        *QUIET,
    ]
    proc = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, output_of(proc)[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    final = rows[-1]
    assert final["eval/examples"] == 8  # 4 per rank, summed
    assert 0 <= final["eval/reward"] <= 1 and 0 <= final["eval/sampled_reward"] <= 1
    assert (tmp_path / "run" / "eval_completions.jsonl").is_file()
