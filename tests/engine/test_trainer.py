"""The trainer on the real tiny model: SFT accumulation is exact; warmup changes nothing."""

from __future__ import annotations

import pytest
import torch
from conftest_model import tiny

from art_hydra.producer import SFTProducer
from art_hydra.trainer import Objective, Trainer

#: These tests train the tiny model.
pytestmark = pytest.mark.slow


def _grads(trainer: Trainer, batches) -> dict[str, torch.Tensor]:  # type: ignore[no-untyped-def]
    trainer.optimizer.zero_grad(set_to_none=True)
    for batch in batches:
        loss, _ = trainer.loss(batch)
        loss.backward()
    return {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


def test_sft_accumulation_equals_the_larger_batch() -> None:
    cfg, loaded, task = tiny(["algorithm=sft"])
    trainer = Trainer(loaded, cfg.trainer, Objective.for_sft())
    examples = task.examples[:8]

    def batches(size: int, accumulation: int):  # type: ignore[no-untyped-def]
        producer = SFTProducer(
            loaded,
            task,
            cfg.sft,
            cfg.producer,
            size,
            accumulation,
            cfg.model.max_seq_length,
            cfg.seed,
        )
        producer.stream.examples = examples
        producer.stream.shuffle = False
        producer.stream.load_state({"epoch": 0, "position": 0})
        return producer.make_inputs()

    two_by_four = _grads(trainer, batches(4, 2))
    one_by_eight = _grads(trainer, batches(8, 1))
    assert two_by_four.keys() == one_by_eight.keys() and two_by_four
    for name, grad in two_by_four.items():
        assert torch.allclose(grad, one_by_eight[name], atol=1e-6, rtol=1e-5), name


def test_warmup_pass_changes_no_weight_and_no_optimizer_moment() -> None:
    cfg, loaded, task = tiny(["algorithm=sft"])
    trainer = Trainer(loaded, cfg.trainer, Objective.for_sft())
    producer = SFTProducer(
        loaded, task, cfg.sft, cfg.producer, 8, 1, cfg.model.max_seq_length, cfg.seed
    )
    # One real step first, so the optimizer has moments that a warmup could disturb.
    assert trainer.train_micro(producer.make_inputs()[0]) is not None
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    moments = {
        k: v.clone()
        for s in trainer.optimizer.state.values()
        for k, v in s.items()
        if torch.is_tensor(v)
    }
    warm = producer.make_inputs()[0]
    warm.warmup = True
    result = trainer.train_micro(warm)
    assert result is not None and result.warmup and result.loss > 0
    assert trainer.step == 1
    for name, value in trainer.model.named_parameters():
        assert torch.equal(value, weights[name]), name
    after = {
        k: v for s in trainer.optimizer.state.values() for k, v in s.items() if torch.is_tensor(v)
    }
    assert all(torch.equal(after[k], moments[k]) for k in moments)
    assert all(p.grad is None for p in trainer.model.parameters())
