"""float16 trains as mixed precision (float32 masters, float16 autocast, loss scaling),
on any device; pure float16 weights overflowed and crashed sampling within a step."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK, tiny

from art_hydra import compose, train
from art_hydra.metrics import read_metrics
from art_hydra.run import build_trainer_and_producer

pytestmark = pytest.mark.slow


def test_float16_keeps_float32_masters_and_scales_the_loss() -> None:
    cfg, _, _ = tiny(["model.dtype=float16"])
    trainer, producer = build_trainer_and_producer(cfg)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert trainer.scaler is not None and trainer.loaded.autocast == torch.float16
    result = trainer.train_micro(producer.make_inputs()[0])
    assert result is not None and math.isfinite(result.loss) and math.isfinite(result.grad_norm)


def test_float16_run_trains_with_finite_losses_and_learns(tmp_path: Path) -> None:
    overrides = [*QUICK, "model.dtype=float16", "trainer.max_steps=40"]
    train(compose(overrides), run_dir=tmp_path)
    rows = read_metrics(tmp_path)
    assert len(rows) == 40
    assert all(math.isfinite(r["loss"]) for r in rows)
    first = sum(r["reward_mean"] for r in rows[:5]) / 5
    last = sum(r["reward_mean"] for r in rows[-5:]) / 5
    assert last > first
