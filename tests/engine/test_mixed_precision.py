"""Half types train as mixed precision: float32 masters and optimizer state under float16
(with loss scaling) or bfloat16 autocast, on any device; pure float16 weights overflowed
and crashed sampling within a step, and pure bfloat16 weights (on request only) round
most small updates away, which a load-time warning measures. LoRA adapters are float32."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_model import QUICK, tiny
from family_models import load_family, save_family

from art_hydra import compose, train
from art_hydra.engine.backends.torch_backend import HalfWeightsError, rounded_away_share
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.queue import StepWork
from art_hydra.engine.recipe import build_trainer_and_producer

pytestmark = pytest.mark.slow


def test_float16_keeps_float32_masters_and_scales_the_loss() -> None:
    cfg, _, _ = tiny(["model.dtype=float16"])
    trainer, producer = build_trainer_and_producer(cfg)
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    assert trainer.scaler is not None and trainer.loaded.autocast == torch.float16
    result = trainer.train_step(StepWork(producer.make_inputs()))
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


# ---- bfloat16: float32 master weights by default, pure weights on request ----------

#: One SFT step at a fine-tuning learning rate on a family model (SFT: every step has a
#: gradient, whatever the rewards of a random model would be).
STEP = [
    "algorithm=sft",
    "trainer.per_device_train_batch_size=8",
    "trainer.learning_rate=5e-6",
    "trainer.max_steps=1",
]


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return save_family(tmp_path_factory.mktemp("qwen2"), "qwen2", {})


def _half_checkpoint(folder: Path, dtype: torch.dtype, into: Path) -> Path:
    """``folder``'s model saved in a half dtype (as released checkpoints are)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).save_pretrained(into)
    AutoTokenizer.from_pretrained(folder).save_pretrained(into)
    return into


def _one_step(folder: Path, overrides: list[str]) -> tuple[Any, float]:
    """(trainer, share of trainable weights one step changed)."""
    cfg, loaded = load_family(folder, overrides=[*STEP, *overrides])
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    result = trainer.train_step(StepWork(producer.make_inputs()))
    assert result is not None and math.isfinite(result.loss)
    changed = sum(int((p.detach() != b).sum()) for p, b in zip(params, before, strict=True))
    return trainer, changed / sum(p.numel() for p in params)


def test_bfloat16_trains_float32_masters_that_change_as_float32_does(qwen2: Path) -> None:
    _, float32 = _one_step(qwen2, ["model.dtype=float32"])
    trainer, masters = _one_step(qwen2, ["model.dtype=bfloat16"])
    assert trainer.loaded.autocast == torch.bfloat16 and trainer.scaler is None
    assert all(p.dtype == torch.float32 for p in trainer.model.parameters())
    moments = [v for s in trainer.optimizer.state.values() for v in s.values() if v.ndim > 0]
    assert moments and all(m.dtype == torch.float32 for m in moments)
    assert float32 > 0.9 and abs(masters - float32) < 0.02, (float32, masters)


def test_pure_bfloat16_weights_warn_with_the_share_that_rounds_away(
    qwen2: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="art_hydra.backends.torch_backend"):
        trainer, pure = _one_step(qwen2, ["model.dtype=bfloat16", "model.master_weights=false"])
    assert trainer.loaded.half_weights and trainer.loaded.autocast is None
    assert all(p.dtype == torch.bfloat16 for p in trainer.model.parameters())
    share = rounded_away_share(trainer.model, 5e-6)
    (message,) = [r.getMessage() for r in caplog.records if "rounds away" in r.getMessage()]
    assert f"{100 * share:.1f}%" in message and "model.master_weights=true" in message
    assert share > 0.9 and pure < 0.2, (share, pure)


def test_the_rounded_away_share_counts_every_weight_an_update_cannot_move() -> None:
    """Not a bound: exactly the weights where ``|w| + lr`` rounds back to ``|w|``."""
    generator = torch.Generator().manual_seed(0)
    layer = torch.nn.Linear(256, 256).to(torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(256, 256, generator=generator) * 0.02)
    weights = torch.cat([p.detach().abs().flatten() for p in layer.parameters()])
    for lr in (6e-5, 1e-4, 1.1e-4):
        stuck = int(((weights.float() + lr).to(torch.bfloat16) == weights).sum())
        assert rounded_away_share(layer, lr) == stuck / weights.numel()
    # Half a step lies between |w| 2^-9 and |w| 2^-8: counting the lower bound only missed
    # about 11% of a std-0.02 layer's weights at lr 1e-4.
    lower_bound = (weights.float() * 2.0**-9 > 1e-4).float().mean().item()
    assert rounded_away_share(layer, 1e-4) > lower_bound + 0.05


def test_no_warning_where_the_learning_rate_moves_bfloat16_weights(qwen2: Path) -> None:
    _, loaded = load_family(qwen2, overrides=["model.dtype=bfloat16", "model.master_weights=false"])
    assert rounded_away_share(loaded.model, 1.0) == 0.0


def test_lora_adapters_train_in_float32_over_a_bfloat16_base(qwen2: Path) -> None:
    overrides = [
        "model.dtype=bfloat16",
        "model.finetune=lora",
        "model.lora.modules_to_save=[lm_head]",
    ]
    trainer, changed = _one_step(qwen2, overrides)
    trained = [p for p in trainer.model.parameters() if p.requires_grad]
    frozen = [p for p in trainer.model.parameters() if not p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen)
    assert trainer.loaded.autocast == torch.bfloat16
    assert changed > 0.5


def test_auto_on_a_half_checkpoint_trains_float32_masters(qwen2: Path, tmp_path: Path) -> None:
    folder = _half_checkpoint(qwen2, torch.bfloat16, tmp_path / "bf16")
    _, loaded = load_family(folder)  # model.dtype=auto
    assert loaded.autocast == torch.bfloat16 and not loaded.half_weights
    assert all(p.dtype == torch.float32 for p in loaded.model.parameters())
    _, pure = load_family(folder, overrides=["model.master_weights=false"])
    assert pure.half_weights and next(pure.model.parameters()).dtype == torch.bfloat16


def test_auto_on_a_float16_checkpoint_refuses_pure_weights(qwen2: Path, tmp_path: Path) -> None:
    folder = _half_checkpoint(qwen2, torch.float16, tmp_path / "fp16")
    with pytest.raises(HalfWeightsError, match=r"model\.master_weights=true"):
        load_family(folder, overrides=["model.master_weights=false"])
    _, loaded = load_family(folder)
    assert loaded.autocast == torch.float16
