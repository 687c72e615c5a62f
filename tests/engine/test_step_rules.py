"""Hugging Face's Trainer's rules where art_hydra's trainer makes the same choice: a
float16 step that loss scaling skips holds the learning-rate schedule too, and weight
decay spares exactly the parameters ``get_decay_parameter_names`` spares."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_model import QUICK, tiny
from family_models import CAPACITY, build_family

from art_hydra import compose, train
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.queue import StepWork
from art_hydra.engine.recipe import build_trainer_and_producer
from art_hydra.engine.trainer import (
    DECAY_RULE,
    LEGACY_DECAY_RULE,
    Trainer,
    TrainingLoss,
    build_optimizer,
    no_decay_parameters,
)

pytestmark = pytest.mark.slow


# ---- a skipped float16 step ------------------------------------------------------------


def test_a_skipped_float16_step_holds_the_schedule_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg, _, _ = tiny(
        ["model.dtype=float16", "trainer.lr_scheduler_type=linear", "trainer.max_steps=10"]
    )
    trainer, producer = build_trainer_and_producer(cfg)
    model = trainer.model
    first = next(p for p in model.parameters() if p.requires_grad)
    # An overflowed gradient, as float16 produces one: GradScaler must skip the step.
    handle = first.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    epoch, lr = trainer.scheduler.last_epoch, trainer.scheduler.get_last_lr()[0]
    with caplog.at_level(logging.WARNING, logger="art_hydra.trainer"):
        skipped = trainer.train_step(StepWork(producer.make_inputs()))
    handle.remove()
    assert skipped is not None and skipped.stats["step_skipped"] == 1.0
    assert "skipped the step" in caplog.text and "step 1" in caplog.text
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())
    assert trainer.scheduler.last_epoch == epoch  # the schedule held
    taken = trainer.train_step(StepWork(producer.make_inputs()))
    assert taken is not None and taken.stats["step_skipped"] == 0.0
    assert taken.learning_rate == lr  # the rate the skipped step would have used
    assert trainer.scheduler.last_epoch == epoch + 1
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters())


def test_a_float16_run_logs_step_skipped_and_others_do_not(tmp_path: Path) -> None:
    train(compose([*QUICK, "model.dtype=float16", "trainer.max_steps=2"]), run_dir=tmp_path)
    assert [r["step_skipped"] for r in read_metrics(tmp_path)] == [0.0, 0.0]
    cfg, _, _ = tiny()
    trainer, producer = build_trainer_and_producer(cfg)
    result = trainer.train_step(StepWork(producer.make_inputs()))
    assert result is not None and "step_skipped" not in result.stats


# ---- weight decay groups ---------------------------------------------------------------

#: Families whose parameter names differ where the rule looks: q/k/v biases (qwen2),
#: q/k norms (qwen3, olmo2), four norms per layer (gemma2, gemma3), fused projections
#: (phi3), routers and experts (qwen2_moe, gpt_oss with sinks and router biases),
#: convolution biases and ``operator_norm`` (lfm2), ``nn.LayerNorm`` modules named ``ln_*``
#: (gpt2, matched by type, not name).
DECAY_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {"tie_word_embeddings": True},
    "qwen2": {},
    "qwen3": {},
    "phi3": {},
    "gemma2": {},
    "gemma3_text": {},
    "olmo2": {},
    "qwen2_moe": {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32},
    "gpt_oss": {"num_local_experts": 4, "num_experts_per_tok": 2},
    "lfm2": {"layer_types": ["conv", "full_attention"], "conv_bias": True},
    "gpt2": {"n_embd": 64, "n_layer": 2, "n_head": 4, "n_positions": CAPACITY},
}


def _hf_decayed(model: Any) -> set[str]:
    """The names Hugging Face's Trainer decays (its optimizer takes named_parameters)."""
    from transformers import Trainer as HFTrainer

    names = set(HFTrainer.get_decay_parameter_names(None, model))
    return {n for n, _ in model.named_parameters() if n in names}


def _ours_decayed(model: Any, rule: str = DECAY_RULE) -> set[str]:
    keep = no_decay_parameters(model, rule)
    return {n for n, p in model.named_parameters() if id(p) not in keep}


@pytest.mark.parametrize("model_type", sorted(DECAY_FAMILIES))
def test_decay_groups_equal_hugging_faces(model_type: str) -> None:
    model = build_family(model_type, DECAY_FAMILIES[model_type])
    ours, theirs = _ours_decayed(model), _hf_decayed(model)
    assert ours == theirs, (sorted(ours - theirs), sorted(theirs - ours))
    names = {n for n, _ in model.named_parameters()}
    assert ours and ours != names  # both groups hold something
    embedding = model.get_input_embeddings().weight
    assert next(n for n, p in model.named_parameters() if p is embedding) in ours


def test_decay_groups_equal_hugging_faces_under_lora() -> None:
    from peft import LoraConfig, get_peft_model

    model = build_family("qwen2", {})
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], modules_to_save=["lm_head"])
    peft_model = get_peft_model(model, lora)
    assert _ours_decayed(peft_model) == _hf_decayed(peft_model)


def test_a_checkpoint_of_the_older_grouping_resumes_with_its_own_groups() -> None:
    """Before, tied embeddings were spared: the groups had other sizes, and torch
    refuses to load moments into groups of another size."""
    cfg, loaded, _ = tiny(["algorithm=sft", "trainer.weight_decay=0.1"])
    model = loaded.model
    assert _ours_decayed(model, LEGACY_DECAY_RULE) != _ours_decayed(model)
    old = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    old.optimizer, old.scheduler = build_optimizer(model, cfg.trainer, LEGACY_DECAY_RULE)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    old.optimizer.step()
    tensors, plain = old.state_dict()
    del plain["decay_rule"]  # as checkpoints of the older code were written
    fresh = Trainer(loaded, cfg.trainer, TrainingLoss.for_sft())
    fresh.load_state_dict(tensors, plain)
    assert fresh.decay_rule == LEGACY_DECAY_RULE
    for group_old, group_new in zip(
        old.optimizer.param_groups, fresh.optimizer.param_groups, strict=True
    ):
        assert [id(p) for p in group_old["params"]] == [id(p) for p in group_new["params"]]
        assert group_old["weight_decay"] == group_new["weight_decay"]
    for p in model.parameters():
        assert torch.equal(old.optimizer.state[p]["exp_avg"], fresh.optimizer.state[p]["exp_avg"])
    assert fresh.state_dict()[1]["decay_rule"] == LEGACY_DECAY_RULE  # and stays so
