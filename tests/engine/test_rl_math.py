"""Advantages, losses, logits processing and sampling against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from conftest_model import tiny

from art_hydra.engine.rl.advantages import group_advantages
from art_hydra.engine.rl.losses import (
    LOG_RATIO_CLAMP,
    NonFiniteLossError,
    PolicyLossSettings,
    policy_loss,
    sft_loss,
)
from art_hydra.engine.rl.sampling import (
    SamplingSettings,
    logprob_logits,
    process_logits,
    sample,
    suppressed_ids,
    token_logprobs,
)


def test_group_advantages_by_hand() -> None:
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5]
    adv, zero = group_advantages(rewards, group_size=4, scale=False)
    assert adv == [0.5, -0.5, -0.5, 0.5, 0.0, 0.0, 0.0, 0.0]
    assert zero == [False, True]  # the second group has equal rewards: no signal, flagged
    scaled, _ = group_advantages(rewards, group_size=4, scale=True, eps=0.0)
    std = math.sqrt((4 * 0.25) / 3)  # sample std of [1, 0, 0, 1]
    assert scaled[:4] == pytest.approx([0.5 / std, -0.5 / std, -0.5 / std, 0.5 / std])
    with pytest.raises(ValueError):
        group_advantages([1.0, 0.0, 1.0], group_size=2, scale=True)


@pytest.mark.parametrize(
    "group",
    [
        [0.1 + 0.2, 0.3, 0.3, 0.3],  # equal but for rounding: no signal, as in TRL
        [1.0, 1.0, 1.0, 1.0],
        [0.0, 1e-6, 0.0, 0.0],  # a real (small) difference
        [0.0, 1.0, 0.0, 0.0],
        [2.0, 2.0 + 4e-9, 2.0, 2.0 - 4e-9],  # spread below the tolerance
        [2.0, 2.0 + 4e-8, 2.0, 2.0 - 4e-8],  # spread above it
    ],
)
def test_a_group_without_signal_is_judged_as_trl_judges_it(group: list[float]) -> None:
    """TRL counts a group as zero-std with ``torch.isclose(rewards.std(), 0)``; the
    ``zero_std_groups`` metric uses the same rule and tolerance."""
    trl = bool(
        torch.isclose(
            torch.tensor(group, dtype=torch.float64).std(), torch.tensor(0.0, dtype=torch.float64)
        )
    )
    _, zero = group_advantages(group, group_size=4, scale=True)
    assert zero == [trl]


def _settings(loss_type: str = "ppo_clip", beta: float = 0.0) -> PolicyLossSettings:
    return PolicyLossSettings(loss_type=loss_type, epsilon=0.2, epsilon_high=0.28, beta=beta)


def test_ppo_clip_by_hand() -> None:
    # Token 1: ratio 1.5, A=+1 -> clipped at 1.28. Token 2: ratio 0.5, A=-2 -> clipped at 0.8
    # (min picks the clipped, larger loss). Token 3: ratio 1, A=+1 -> -1. Masked token ignored.
    logp = torch.log(torch.tensor([1.5, 0.5, 1.0, 7.0]))
    old = torch.zeros(4)
    adv = torch.tensor([1.0, -2.0, 1.0, 5.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss, stats = policy_loss(logp, old, adv, mask, _settings(), num_tokens=3.0)
    expected = (-1.28 + 2 * 0.8 - 1.0) / 3
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    assert stats["clip_fraction"] == pytest.approx(2 / 3)


def test_cispo_by_hand_caps_at_epsilon_high_itself_and_counts_capped_tokens() -> None:
    """TRL's convention: the weight is min(r, epsilon_high), not min(r, 1 + epsilon_high)."""
    logp = torch.log(torch.tensor([1.5, 2.0, 1.0, 1.5])).requires_grad_(True)
    old = torch.zeros(4)
    adv = torch.tensor([1.0, 1.0, 1.0, -1.0])
    cispo = PolicyLossSettings("cispo", epsilon=0.2, epsilon_high=1.28, beta=0.0)
    loss, stats = policy_loss(logp, old, adv, torch.ones(4), cispo, 4.0)
    # weights (detached): 1.28, 1.28, 1.0, 1.28; loss = -(w * A * logp).mean
    expected = -(1.28 * math.log(1.5) + 1.28 * math.log(2.0) - 1.28 * math.log(1.5)) / 4
    assert loss.item() == pytest.approx(expected)
    loss.backward()
    assert logp.grad is not None
    assert torch.allclose(logp.grad, torch.tensor([-0.32, -0.32, -0.25, 0.32]))
    # Capped: every token but the third; TRL's count (clip_fraction) takes A > 0 only.
    assert stats["clip_fraction"] == pytest.approx(2 / 4)
    assert stats["cispo_capped_fraction"] == pytest.approx(3 / 4)


def test_kl_penalty_k3_by_hand() -> None:
    logp = torch.tensor([0.0])
    ref = torch.tensor([math.log(2.0)])
    loss, stats = policy_loss(
        logp,
        logp.clone(),
        torch.zeros(1),
        torch.ones(1),
        _settings(beta=0.5),
        1.0,
        ref_logprobs=ref,
    )
    k3 = 2.0 - math.log(2.0) - 1.0
    assert stats["kl"] == pytest.approx(k3)
    assert loss.item() == pytest.approx(0.5 * k3)


def test_log_ratio_is_clamped_and_non_finite_loss_is_caught() -> None:
    logp = torch.tensor([0.0])
    old = torch.tensor([-1000.0])  # would overflow exp() without the clamp
    loss, _ = policy_loss(logp, old, torch.ones(1), torch.ones(1), _settings(), 1.0)
    assert math.isfinite(loss.item())
    assert loss.item() == pytest.approx(-1.28)  # clipped at 1 + epsilon_high
    assert LOG_RATIO_CLAMP < 80
    with pytest.raises(NonFiniteLossError, match="not taken"):
        policy_loss(logp, old, torch.tensor([float("nan")]), torch.ones(1), _settings(), 1.0)
    with pytest.raises(NonFiniteLossError):
        sft_loss(torch.tensor([float("-inf")]), torch.ones(1), 1.0)


def test_process_logits_top_k_top_p_and_suppression() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.15, 0.10]]))
    top_k = process_logits(logits, SamplingSettings(top_k=2))
    assert torch.isinf(top_k[0, 2:]).all() and torch.isfinite(top_k[0, :2]).all()
    top_p = process_logits(logits, SamplingSettings(top_p=0.7))  # keeps 0.5 + 0.25
    assert torch.isfinite(top_p[0, :2]).all() and torch.isinf(top_p[0, 2:]).all()
    hot = process_logits(logits, SamplingSettings(temperature=2.0, suppress_ids=(0,)))
    assert torch.isinf(hot[0, 0])
    assert hot[0, 1].item() == pytest.approx(logits[0, 1].item() / 2)


def test_logprobs_ignore_top_k_and_top_p_but_keep_temperature_and_suppression() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, 11, generator=gen)
    targets = torch.randint(0, 11, (3, 5), generator=gen)
    lowest = logits[0, 0].clone()
    lowest[3] = float("inf")  # id 3 is suppressed below: never a sampled token
    targets[0, 0] = int(lowest.argmin())  # far outside the top-k
    settings = SamplingSettings(temperature=0.7, top_k=2, top_p=0.5, suppress_ids=(3,))
    logp, entropy = token_logprobs(logits, targets, settings)
    scaled = logits / 0.7
    scaled[..., 3] = float("-inf")
    expected = torch.log_softmax(scaled, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    assert torch.equal(logp, expected)
    assert torch.isfinite(logp[0, 0]) and logp[0, 0] == expected[0, 0]
    assert torch.isinf(process_logits(logits, settings)[0, 0, targets[0, 0]])  # never drawn
    assert torch.equal(logprob_logits(logits, settings), scaled)
    assert (entropy >= 0).all() and (entropy <= math.log(10) + 1e-5).all()


def test_sampler_draws_from_top_k_and_records_untruncated_logprobs() -> None:
    _, loaded, _ = tiny()
    model, tok = loaded.model.eval(), loaded.tokenizer
    settings = SamplingSettings(temperature=1.3, top_k=2, suppress_ids=suppressed_ids(tok))
    prompts = [list(tok(text)["input_ids"]) for text in ("abc=", "ab=", "cab=", "b=")]
    completions, recorded = sample(
        model,
        prompts,
        6,
        settings,
        (tok.eos_token_id,),
        tok.pad_token_id,
        torch.Generator().manual_seed(0),
    )
    with torch.no_grad():
        for prompt, completion, values in zip(prompts, completions, recorded, strict=True):
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1]
            drawn = torch.tensor(completion)
            # Every token came from the top 2 ...
            top2 = process_logits(logits, settings).isfinite()
            assert top2.gather(-1, drawn.unsqueeze(-1)).all()
            # ... and its logprob is the untruncated one that training computes.
            trained, _ = token_logprobs(logits, drawn, settings)
            assert torch.allclose(torch.tensor(values), trained, atol=1e-5)
            # Not the truncated one, which renormalises over two tokens and is larger.
            narrow = torch.log_softmax(process_logits(logits, settings), -1)
            assert (trained < narrow.gather(-1, drawn.unsqueeze(-1)).squeeze(-1)).all()
