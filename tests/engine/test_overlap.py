"""rl.overlap_rollouts: the next generation batch is sampled on a copy of the policy
while the trainer trains on the current one, one optimizer step off-policy; the run
still learns, resumes exactly, and the founding rule and its checks hold."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from conftest import problem_about
from conftest_model import QUICK
from safetensors.torch import load_file

from art_hydra import compose, train
from art_hydra.config.problems import ConfigValidationError, Kind, Severity

QUIET = ["logging.progress_bar=off", "logging.tensorboard=false", "logging.plot=false"]


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_overlapped_rollouts_learn_one_step_off_policy(tmp_path: Path) -> None:
    common = [*QUIET, "trainer.max_steps=60", "checkpoint.every_steps=0", "seed=0"]
    threads = threading.active_count()
    train(compose([*common, "rl.overlap_rollouts=true"]), run_dir=tmp_path / "overlap")
    assert threading.active_count() == threads  # the rollouts thread is gone
    train(compose(common), run_dir=tmp_path / "sync")
    overlap, sync = _metrics(tmp_path / "overlap"), _metrics(tmp_path / "sync")
    # Step 1 trains on rollouts of the weights it starts from; from step 2 on each batch
    # was sampled one step earlier, so the ratio moves off 1 and clipping acts. In the
    # synchronous loop every batch comes from the current weights: no clipping ever.
    assert overlap[0]["clip_fraction"] == 0.0
    assert max(m["clip_fraction"] for m in overlap[1:]) > 0.0
    assert all(m["clip_fraction"] == 0.0 for m in sync)
    first = sum(m["reward_mean"] for m in overlap[:5]) / 5
    last = sum(m["reward_mean"] for m in overlap[-5:]) / 5
    assert last > first + 0.1, (first, last)


@pytest.mark.slow
def test_an_overlapped_run_resumes_to_the_very_same_weights(tmp_path: Path) -> None:
    """The batch sampled ahead is part of the checkpoint: a run stopped at step 3 and
    resumed to step 6 ends bit for bit where one run of 6 steps ends."""
    common = [
        *QUICK,
        "rl.overlap_rollouts=true",
        "trainer.lr_scheduler_type=constant",
        "checkpoint.every_steps=3",
        "checkpoint.keep_last=5",
    ]
    train(compose([*common, "trainer.max_steps=6"]), run_dir=tmp_path / "whole")
    train(compose([*common, "trainer.max_steps=3"]), run_dir=tmp_path / "parts")
    train(compose([*common, "trainer.max_steps=6", "resume=true"]), run_dir=tmp_path / "parts")
    final = "checkpoints/step-000006/model.safetensors"
    a, b = load_file(tmp_path / "whole" / final), load_file(tmp_path / "parts" / final)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rewards = [m["reward_mean"] for m in _metrics(tmp_path / "parts")]
    assert rewards == [m["reward_mean"] for m in _metrics(tmp_path / "whole")]


@pytest.mark.fast  # refused at composition
def test_overlapped_rollouts_with_unsloth_are_refused_at_composition() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["rl.overlap_rollouts=true", "backend=unsloth", "backend.device=cuda"])
    problem = problem_about(info.value, "rl.overlap_rollouts")
    assert (problem.kind, problem.severity) == (Kind.rule, Severity.error)
    assert problem.fix.overrides() == ["rl.overlap_rollouts=false"]
    assert problem.fix.alt is not None and problem.fix.alt.overrides() == ["backend=torch"]


@pytest.mark.fast  # refused at composition
def test_overlapped_rollouts_keep_the_founding_rule() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["rl.overlap_rollouts=true", "trainer.gradient_accumulation_steps=2"])
    problem = problem_about(info.value, "trainer.gradient_accumulation_steps")
    assert (problem.value, problem.kind, problem.severity) == (2, Kind.rule, Severity.error)
    assert "trainer.gradient_accumulation_steps=1" in problem.fix.overrides()
