"""Several optimizer steps per generation batch (TRL's num_iterations and
steps_per_generation): each mini-batch is one input and one result, so the queue
protocol holds, and from the second pass on the ratio moves off 1 and clipping acts."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest_model import QUICK, tiny
from safetensors.torch import load_file

from art_hydra import compose, train
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.recipe import build_trainer_and_producer

pytestmark = pytest.mark.slow


def test_a_generation_batch_is_split_and_reused_in_order() -> None:
    cfg, _, _ = tiny(["rl.steps_per_generation=2", "rl.num_iterations=2"])
    _, producer = build_trainer_and_producer(cfg)
    inputs = [producer.make_inputs()[0] for _ in range(4)]
    assert producer.generations == 1  # one sampling call feeds four optimizer steps
    assert torch.equal(inputs[0].input_ids, inputs[2].input_ids)
    assert torch.equal(inputs[1].input_ids, inputs[3].input_ids)
    assert not torch.equal(inputs[0].input_ids, inputs[1].input_ids)
    assert all(b.input_ids.shape[0] >= 1 for b in inputs)
    assert sum(b.loss_mask.sum() > 0 for b in inputs) == 4
    producer.make_inputs()
    assert producer.generations == 2


def _clip_fractions(tmp_path: Path, iterations: int) -> list[float]:
    overrides = [*QUICK, "trainer.max_steps=12", f"rl.num_iterations={iterations}"]
    train(compose(overrides), run_dir=tmp_path / str(iterations))
    return [m["clip_fraction"] for m in read_metrics(tmp_path / str(iterations))]


def test_clipping_acts_only_when_rollouts_are_reused(tmp_path: Path) -> None:
    once = _clip_fractions(tmp_path, 1)
    twice = _clip_fractions(tmp_path, 2)
    assert max(once) == 0.0  # every step at the weights that sampled it: ratio exactly 1
    assert max(twice) > 0.0
    assert all(twice[i] == 0.0 for i in range(0, 12, 2))  # first pass of each batch: on-policy


def test_resume_in_the_middle_of_a_generation_batch_is_exact(tmp_path: Path) -> None:
    common = [
        *QUICK,
        "rl.steps_per_generation=2",
        "rl.num_iterations=2",
        "trainer.lr_scheduler_type=constant",
        "checkpoint.every_steps=1",
        "checkpoint.keep_last=10",
    ]
    train(compose([*common, "trainer.max_steps=8"]), run_dir=tmp_path / "whole")
    parts = tmp_path / "parts"
    train(compose([*common, "trainer.max_steps=3"]), run_dir=parts)  # stops mid-batch
    train(compose([*common, "trainer.max_steps=8", "resume=true"]), run_dir=parts)
    whole_rows, part_rows = read_metrics(tmp_path / "whole"), read_metrics(parts)
    assert [m["step"] for m in part_rows] == list(range(1, 9))
    for a, b in zip(whole_rows, part_rows, strict=True):
        assert (a["loss"], a["reward_mean"], a["clip_fraction"]) == (
            b["loss"],
            b["reward_mean"],
            b["clip_fraction"],
        )
    final = "checkpoints/step-000008/model.safetensors"
    a, b = load_file(tmp_path / "whole" / final), load_file(parts / final)
    assert all(torch.equal(a[k], b[k]) for k in a)
