"""The trainer on real tiny models: SFT accumulation is exact; warmup changes nothing;
weight decay spares biases and norms (Hugging Face's rule)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest_model import tiny, with_values
from family_models import load_family, save_family

from art_hydra.engine.producer import SFTProducer
from art_hydra.engine.queue import DeadlockError, StepWork
from art_hydra.engine.trainer import Trainer, TrainingLoss

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
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    examples = task.examples[:8]

    def batches(size: int, accumulation: int):  # type: ignore[no-untyped-def]
        step = {
            "trainer.per_device_train_batch_size": size,
            "trainer.gradient_accumulation_steps": accumulation,
        }
        producer = SFTProducer(loaded, task, with_values(cfg, step))
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
    cfg, loaded, task = tiny(["algorithm=sft", "trainer.per_device_train_batch_size=8"])
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    producer = SFTProducer(loaded, task, cfg)
    # One real step first, so the optimizer has moments that a warmup could disturb.
    assert trainer.train_step(StepWork(producer.make_inputs())) is not None
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    moments = {
        k: v.clone()
        for s in trainer.optimizer.state.values()
        for k, v in s.items()
        if torch.is_tensor(v)
    }
    warm = StepWork(producer.make_inputs(), warmup=True)
    result = trainer.train_step(warm)
    assert result is not None and result.warmup and result.loss > 0
    assert trainer.step == 1
    for name, value in trainer.model.named_parameters():
        assert torch.equal(value, weights[name]), name
    after = {
        k: v for s in trainer.optimizer.state.values() for k, v in s.items() if torch.is_tensor(v)
    }
    assert all(torch.equal(after[k], moments[k]) for k in moments)
    assert all(p.grad is None for p in trainer.model.parameters())


def test_a_step_short_of_its_micro_batches_is_the_deadlock_and_trains_nothing() -> None:
    """Accumulation 2 handed one micro-batch (RL's one input per step, the validators
    bypassed): the founding deadlock, named before any forward or weight change."""
    cfg, loaded, task = tiny(
        [
            "algorithm=sft",
            "trainer.gradient_accumulation_steps=2",
            "trainer.per_device_train_batch_size=8",
        ]
    )
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    one_input = with_values(cfg, {"trainer.gradient_accumulation_steps": 1})
    producer = SFTProducer(loaded, task, one_input)
    weights = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    with pytest.raises(DeadlockError, match="the trainer waits for input #2 of that step"):
        trainer.train_step(StepWork(producer.make_inputs()))
    assert trainer.step == 0
    assert all(torch.equal(p, weights[n]) for n, p in trainer.model.named_parameters())
    assert all(p.grad is None for p in trainer.model.parameters())


def test_no_weight_decay_on_biases_and_norms_but_on_tied_embeddings(tmp_path: Path) -> None:
    """Qwen2 has q/k/v biases, RMSNorm weights and (here) a head tied to the embeddings,
    which decay as Hugging Face's Trainer decays them (transformers 5.2x)."""
    folder = save_family(tmp_path, "qwen2", {"tie_word_embeddings": True})
    cfg, loaded = load_family(folder, overrides=["trainer.weight_decay=0.1"])
    model = loaded.model
    assert model.lm_head.weight is model.model.embed_tokens.weight
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    decayed, kept = trainer.optimizer.param_groups
    assert decayed["weight_decay"] == 0.1 and kept["weight_decay"] == 0.0
    names = {id(p): n for n, p in model.named_parameters()}
    kept_names = {names[id(p)] for p in kept["params"]}
    decayed_names = {names[id(p)] for p in decayed["params"]}
    assert kept_names == {n for n in names.values() if n.endswith(".bias") or "norm" in n}
    assert any(".q_proj.bias" in n for n in kept_names)
    assert any("input_layernorm" in n for n in kept_names) and "model.norm.weight" in kept_names
    assert decayed_names == set(names.values()) - kept_names
    assert "model.embed_tokens.weight" in decayed_names
    assert all(n.endswith("_proj.weight") for n in decayed_names - {"model.embed_tokens.weight"})

    # A step on zero gradients: AdamW's update is 0, so only decay moves a weight, and
    # exactly by the factor 1 - lr * weight_decay.
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    lr = trainer.scheduler.get_last_lr()[0]
    trainer.optimizer.step()
    for name, param in model.named_parameters():
        if name in kept_names:
            assert torch.equal(param, before[name]), name
        else:
            assert torch.allclose(param, before[name] * (1 - lr * 0.1), rtol=0, atol=1e-7), name


def test_without_weight_decay_one_group_in_parameter_order() -> None:
    cfg, loaded, _ = tiny(["algorithm=sft"])
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    (group,) = trainer.optimizer.param_groups
    assert [id(p) for p in group["params"]] == [id(p) for p in loaded.model.parameters()]
