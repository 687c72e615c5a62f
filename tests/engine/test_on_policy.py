"""One precision for sampling and training, and on-policy ratios of exactly 1.

Rollouts are sampled under the autocast the trainer computes in; an on-policy step takes
its old logprobs from its own training forward, detached (as TRL does), so the ratio is
exactly 1 and nothing clips at step 1 whatever the dtype; the sampler's own logprobs are
kept for the ``sampling_mismatch`` metrics and truncated importance sampling
(``rl.importance_sampling_cap``). Off-policy steps (several iterations, several steps per
generation, overlapped rollouts) take their old logprobs from a forward at sampling time
in the same precision and layout.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest_model import tiny
from family_models import FAMILIES, family_folder, family_params, load_family

from art_hydra.engine.queue import StepWork
from art_hydra.engine.recipe import build_trainer_and_producer
from art_hydra.engine.rl.losses import (
    PolicyLossSettings,
    policy_loss,
    sampling_mismatch,
    truncated_importance_weight,
)

pytestmark = pytest.mark.slow

DTYPES = ("float32", "bfloat16", "float16")
#: A small RL step on a family model: 2 groups of 4 completions of up to 8 tokens.
SMALL = [
    "trainer.per_device_train_batch_size=8",
    "rl.num_generations=4",
    "rl.max_completion_length=8",
    "rl.epsilon=1e-4",
    "trainer.learning_rate=5e-6",
]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each family's saved folder, made once for the session when a test first asks for
    it (a run of a few families builds only theirs)."""

    class Made(dict[str, Path]):
        def __missing__(self, name: str) -> Path:
            self[name] = family_folder(name, tmp_path_factory)
            return self[name]

    return Made()


def _first_step(folder: Path, family: str, dtype: str, extra: list[str] | None = None) -> Any:
    attn = "eager" if family == "llama-eager" else None
    cfg, loaded = load_family(folder, attn, [*SMALL, f"model.dtype={dtype}", *(extra or [])])
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    batch = producer.make_inputs()[0]
    assert batch.on_policy
    return trainer.train_step(StepWork([batch]))


@pytest.mark.parametrize("family", family_params(FAMILIES))
def test_step_one_ratio_is_exactly_one_in_every_precision(
    folders: dict[str, Path], family: str
) -> None:
    """At rl.epsilon=1e-4 any ratio off 1 by more than 1e-4 would clip: none does, in
    float32, bfloat16 and float16, on every family; the sampler's gap is reported."""
    for dtype in DTYPES:
        result = _first_step(folders[family], family, dtype)
        assert result.clip_fraction == 0.0, (family, dtype)
        assert math.isfinite(result.loss), (family, dtype)
        mean = result.stats["sampling_mismatch_mean"]
        largest = result.stats["sampling_mismatch_max"]
        assert 0.0 <= mean <= largest < math.inf, (family, dtype)
        # float32: the cache and the full forward differ by rounding (measured up to 6e-5
        # on one token); half types by more (means up to 1.2e-2, and a float16 MoE
        # routes a token differently now and then: 0.36 on one token).
        assert mean < (1e-4 if dtype == "float32" else 0.05), (family, dtype, mean)


def test_the_sampler_computes_under_the_training_autocast(folders: dict[str, Path]) -> None:
    """bfloat16 sampling under autocast: the sampler's logprobs are those of a bfloat16
    computation, close to the training forward's (before, it sampled in float32)."""
    found = {}
    for dtype in ("float32", "bfloat16"):
        result = _first_step(folders["qwen2"], "qwen2", dtype)
        found[dtype] = result.stats["sampling_mismatch_mean"]
    assert found["float32"] < 1e-5 < found["bfloat16"] < 0.05, found


def test_off_policy_old_logprobs_come_from_a_forward_at_sampling_time() -> None:
    """steps_per_generation=2 in bfloat16: each sequence carries the sampler's logprobs
    and old logprobs from a forward in the trainer's precision and layout, so the first
    step on the batch (still the sampling weights) has ratio 1 within rounding."""
    overrides = ["rl.steps_per_generation=2", "rl.epsilon=1e-4", "trainer.max_steps=2"]
    cfg, loaded, _ = tiny(["model.dtype=bfloat16", *overrides])
    trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
    batch = producer.make_inputs()[0]
    assert not batch.on_policy and batch.sampler_logprobs is not None
    for mini in producer.pending:
        for seq in mini.sequences:
            completion = len(seq.tokens) - seq.prompt_len
            assert len(seq.old_logprobs) == len(seq.sampler_logprobs) == completion
    result = trainer.train_step(StepWork([batch]))
    assert result.clip_fraction == 0.0
    assert result.stats["sampling_mismatch_max"] < 0.5


@pytest.mark.parametrize(
    "overrides",
    [[], ["rl.steps_per_generation=2", "trainer.max_steps=2"], ["rl.overlap_rollouts=true"]],
    ids=["on-policy", "off-policy", "overlapped"],
)
def test_the_importance_sampling_cap_scales_the_policy_term(overrides: list[str]) -> None:
    """A cap of 0.5 is below every token's weight (about 1 in float32): the policy term,
    hence the loss at beta=0, is exactly halved on every path; without a cap it is not."""
    losses = {}
    for cap in ("null", "0.5"):
        cfg, loaded, _ = tiny([*overrides, f"rl.importance_sampling_cap={cap}"])
        trainer, producer = build_trainer_and_producer(cfg, loaded=loaded)
        batch = producer.make_inputs()[0]
        losses[cap] = float(trainer.loss(batch)[0].detach())
    assert losses["null"] != 0.0
    assert losses["0.5"] == pytest.approx(0.5 * losses["null"], rel=1e-5, abs=1e-9)


def _trl_token_truncate_loss(
    logps: torch.Tensor,
    old: torch.Tensor,
    sampler: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
    cap: float,
    beta: float,
    ref: torch.Tensor,
) -> torch.Tensor:
    """TRL 1.16's GRPO loss with vllm_importance_sampling_mode=token_truncate, written
    out from its _compute_loss (loss_type=dapo-style sum over the given token count)."""
    is_ratio = torch.clamp(torch.exp(old - sampler), max=cap)
    coef_1 = torch.exp(logps - old)
    coef_2 = torch.clamp(coef_1, 1 - eps_low, 1 + eps_high)
    per_token_loss = -torch.min(coef_1 * advantages, coef_2 * advantages)
    per_token_loss = per_token_loss * is_ratio
    per_token_kl = torch.exp(ref - logps) - (ref - logps) - 1
    per_token_loss = per_token_loss + beta * per_token_kl
    return (per_token_loss * mask).sum() / mask.sum()


def test_the_importance_weight_is_trls_token_truncate() -> None:
    gen = torch.Generator().manual_seed(0)
    shape = (3, 11)
    logps = -torch.rand(shape, generator=gen) * 3
    old = logps + 0.3 * torch.randn(shape, generator=gen)
    sampler = old + 0.5 * torch.randn(shape, generator=gen)
    ref = logps + 0.2 * torch.randn(shape, generator=gen)
    advantages = torch.randn(shape, generator=gen)
    mask = (torch.rand(shape, generator=gen) > 0.2).float()
    settings = PolicyLossSettings("ppo_clip", 0.2, 0.28, 0.04, 1.5)
    weight = truncated_importance_weight(old, sampler, mask, 1.5)
    assert float(weight[mask > 0].max()) == 1.5 and float(weight[mask > 0].min()) < 1.0
    ours, _ = policy_loss(logps, old, advantages, mask, settings, float(mask.sum()), ref, weight)
    theirs = _trl_token_truncate_loss(
        logps, old, sampler, advantages, mask, 0.2, 0.28, 1.5, 0.04, ref
    )
    assert float(ours) == pytest.approx(float(theirs), abs=1e-6)
    gap = sampling_mismatch(old, sampler, mask)
    keep = mask > 0
    assert gap["sampling_mismatch_max"] == pytest.approx(float((old - sampler)[keep].abs().max()))
    assert gap["sampling_mismatch_mean"] == pytest.approx(
        float((old - sampler)[keep].abs().mean()), rel=1e-6
    )
