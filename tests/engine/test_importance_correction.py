"""The off-policy correction modes of ``rl.importance_sampling_cap``
(``rl.importance_sampling_mode``, TRL's ``vllm_importance_sampling_mode``).

Each mode's weights are checked against its definition, computed here from the
completions' own logprob lists (not from the packed tensors the code reads), on a packed
row holding two completions; ``token_truncate`` must keep today's numbers bit for bit;
a masked token must pass no gradient; and a short real run with ``sequence_mask`` trains
and logs ``importance_sampling_masked_fraction``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from conftest_model import QUICK, tiny

from art_hydra import compose, train
from art_hydra.engine.packing import PACKED, Sequence, completion_values, pack
from art_hydra.engine.recipe import build_trainer_and_producer
from art_hydra.engine.rl.losses import (
    LOG_RATIO_CLAMP,
    PolicyLossSettings,
    importance_weight,
    policy_loss,
    truncated_importance_weight,
)

MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
CAP = 2.0
#: Per completion token, the trainer's minus the sampler's logprob. Completion a holds a
#: token above the cap (exp(0.9) = 2.46) and its sum is too (exp(0.8) = 2.23); b's tokens
#: and sum (exp(-0.1)) are all below it.
GAPS = {"a": [0.1, 0.9, -0.2], "b": [0.3, -0.5, 0.1]}


def _expected(mode: str, gaps: list[float]) -> list[float]:
    """A completion's per-token weights, straight from the mode's definition."""
    if mode.startswith("token_"):
        ratios = [math.exp(g) for g in gaps]
    else:
        ratios = [math.exp(sum(gaps))] * len(gaps)
    if mode.endswith("_truncate"):
        return [min(r, CAP) for r in ratios]
    return [0.0 if r > CAP else r for r in ratios]


def _hand_row() -> tuple[torch.Tensor, ...]:
    """One packed row: completion a (id 0), completion b (id 1), then padding (-1). The
    untrained slots (each prompt's, and padding) hold a wild gap that must not count."""
    seq_ids = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, -1]])
    mask = torch.tensor([[0, 1, 1, 1, 0, 1, 1, 1, 0]], dtype=torch.float32)
    sampler = torch.tensor([[0.0, -1.0, -2.0, -0.5, 0.0, -1.5, -0.7, -3.0, 0.0]])
    gaps = torch.tensor([[-30.0, *GAPS["a"], 25.0, *GAPS["b"], 40.0]])
    return sampler + gaps, sampler, mask, seq_ids


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_weighs_a_packed_row_as_its_definition_says(mode: str) -> None:
    old, sampler, mask, seq_ids = _hand_row()
    weight, stats = importance_weight(old, sampler, mask, seq_ids, CAP, mode)
    expected = _expected(mode, GAPS["a"]) + _expected(mode, GAPS["b"])
    trained = weight[mask > 0].tolist()
    assert trained == pytest.approx(expected, rel=1e-5)
    assert not weight.requires_grad
    if mode.endswith("_mask"):
        dropped = sum(w == 0.0 for w in expected) / len(expected)
        assert dropped > 0  # the row was built so that each mask mode drops something
        assert stats == {"importance_sampling_masked_fraction": pytest.approx(dropped)}
    else:
        assert stats == {}


@pytest.mark.parametrize("mode", ("sequence_truncate", "sequence_mask"))
def test_completions_sharing_a_prompt_in_a_row_each_get_their_own_ratio(mode: str) -> None:
    """Packed by :func:`pack` with the group's prompt written once: the prompt copy has an
    id of its own and no trained token, and each completion's ratio is its own sum."""
    prompt = [5, 6, 7, 8]
    sequences = []
    for tokens, gaps in (([*prompt, 1, 2, 3], GAPS["a"]), ([*prompt, 4, 5, 6], GAPS["b"])):
        sampler = [-1.0, -0.5, -2.0]
        old = [s + g for s, g in zip(sampler, gaps, strict=True)]
        sequences.append(Sequence(tokens, len(prompt), old_logprobs=old, sampler_logprobs=sampler))
    batch = pack(sequences, capacity=64, pad_id=0, layout=PACKED, share_prompts=True)
    assert batch.input_ids.shape[0] == 1 and batch.sees_ids is not None  # one row, shared
    assert batch.sampler_logprobs is not None
    weight, _ = importance_weight(
        batch.old_logprobs, batch.sampler_logprobs, batch.loss_mask, batch.seq_ids, CAP, mode
    )
    found = completion_values(batch, weight, sequences)
    assert found[0] == pytest.approx(_expected(mode, GAPS["a"]), rel=1e-5)
    assert found[1] == pytest.approx(_expected(mode, GAPS["b"]), rel=1e-5)


def test_token_truncate_keeps_the_old_numbers_bit_for_bit() -> None:
    generator = torch.Generator().manual_seed(0)
    old = -torch.rand(4, 32, generator=generator) * 5
    sampler = old + torch.randn(4, 32, generator=generator) * 0.7
    mask = (torch.rand(4, 32, generator=generator) > 0.3).float()
    seq_ids = torch.arange(32).div(8, rounding_mode="floor").expand(4, 32)
    weight, stats = importance_weight(old, sampler, mask, seq_ids, 1.5, "token_truncate")
    # The formula the trainer used before the modes existed, written out here.
    delta = torch.where(mask > 0, old - sampler, 0.0)
    before = torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=1.5)
    assert torch.equal(weight, before)
    assert torch.equal(weight, truncated_importance_weight(old, sampler, mask, 1.5))
    assert (weight == 1.5).any() and (weight < 1.5).any()  # the cap bit on some tokens
    assert stats == {}


@pytest.mark.parametrize("mode", ("token_mask", "sequence_mask"))
def test_a_masked_token_passes_no_gradient(mode: str) -> None:
    old, sampler, mask, seq_ids = _hand_row()
    weight, _ = importance_weight(old, sampler, mask, seq_ids, CAP, mode)
    logprobs = old.clone().requires_grad_(True)
    advantages = torch.full_like(mask, 1.0)
    settings = PolicyLossSettings("ppo_clip", 0.2, 0.28, 0.0, CAP, mode)
    loss, _ = policy_loss(
        logprobs, old, advantages, mask, settings, float(mask.sum()), None, weight
    )
    loss.backward()
    assert logprobs.grad is not None
    dropped = (weight == 0) & (mask > 0)
    kept = (weight > 0) & (mask > 0)
    assert dropped.any() and kept.any()
    assert (logprobs.grad[dropped] == 0).all()
    assert (logprobs.grad[kept] != 0).all()


@pytest.mark.parametrize("mode", MODES)
def test_a_wild_gap_cannot_overflow_the_weight(mode: str) -> None:
    """Log-ratios of 1000 (a -inf-like sampler logprob) on every token of a completion:
    each token's and the completion's sum are clamped before exp."""
    seq_ids = torch.tensor([[0, 0, 0, 0, 1, 1]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1]], dtype=torch.float32)
    old = torch.tensor([[0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    sampler = torch.tensor([[-1000.0, -1000.0, -1000.0, -1000.0, 1000.0, 1000.0]])
    weight, _ = importance_weight(old, sampler, mask, seq_ids, 1e12, mode)
    assert torch.isfinite(weight).all()
    high, low = math.exp(LOG_RATIO_CLAMP), math.exp(-LOG_RATIO_CLAMP)
    assert weight[0, :4].tolist() == pytest.approx([high] * 4, rel=1e-5)
    assert weight[0, 4:].tolist() == pytest.approx([low] * 2, rel=1e-5)


def test_the_mode_is_read_only_where_the_cap_is_set() -> None:
    cfg = compose(["rl.importance_sampling_mode=sequence_mask"])
    assert PolicyLossSettings.from_config(cfg.rl).importance_sampling_mode == "token_truncate"
    cfg = compose(["rl.importance_sampling_mode=sequence_mask", "rl.importance_sampling_cap=2"])
    settings = PolicyLossSettings.from_config(cfg.rl)
    assert (settings.importance_sampling_cap, settings.importance_sampling_mode) == (
        2.0,
        "sequence_mask",
    )


def test_the_trainer_applies_the_chosen_mode() -> None:
    """On-policy in float32 every ratio is about 1: a cap of 0.5 halves the policy term
    under the truncating modes and drops every token under the masking ones (beta=0,
    so the loss is the policy term alone)."""
    losses, fractions = {}, {}
    for mode in ("token_truncate", "sequence_truncate", "token_mask", "sequence_mask", None):
        cap = "null" if mode is None else "0.5"
        extra = [] if mode is None else [f"rl.importance_sampling_mode={mode}"]
        cfg, loaded, _ = tiny([f"rl.importance_sampling_cap={cap}", *extra])
        trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
        batch = producer.make_inputs()[0]
        loss, stats = trainer.loss(batch)
        losses[mode] = float(loss.detach())
        fractions[mode] = stats.get("importance_sampling_masked_fraction")
    assert losses[None] != 0.0
    for mode in ("token_truncate", "sequence_truncate"):
        assert losses[mode] == pytest.approx(0.5 * losses[None], rel=1e-5, abs=1e-9)
        assert fractions[mode] is None
    for mode in ("token_mask", "sequence_mask"):
        assert losses[mode] == 0.0
        assert fractions[mode] == 1.0


def test_a_sequence_mask_run_trains_and_logs_the_masked_fraction(tmp_path: Path) -> None:
    cfg = compose(
        [
            *QUICK,
            "trainer.max_steps=2",
            "rl.importance_sampling_cap=2",
            "rl.importance_sampling_mode=sequence_mask",
            "objective.metric=importance_sampling_masked_fraction",
        ]
    )
    result = train(cfg, run_dir=tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    steps = [r for r in rows if "loss" in r]
    assert len(steps) == 2
    for row in steps:
        assert 0.0 <= row["importance_sampling_masked_fraction"] <= 1.0
        assert math.isfinite(row["loss"]) and math.isfinite(row["grad_norm"])
    assert math.isfinite(float(result))  # the objective reads the logged metric
