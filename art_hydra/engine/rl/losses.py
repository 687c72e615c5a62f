"""Policy-gradient losses (PPO-clip, CISPO) with an optional KL to the reference.

Each policy loss is one function registered with :func:`register_policy_loss` (it
declares the ``rl.*`` settings it honours); :func:`policy_loss` wraps the chosen one in
what every loss shares (the masking, the ratio, the importance weight, the KL term, the
aggregation of the per-token terms as ``rl.loss_aggregation`` says (:func:`aggregate`),
the finite check and the statistics). The module imports torch
only inside its functions, so validation reads the built-in losses' names and settings
from the registry (:mod:`art_hydra.config.policy_losses`) without loading torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from art_hydra.config.policy_losses import (
    LOSS_AGGREGATIONS,
    get_policy_loss,
    register_policy_loss,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "IMPORTANCE_SAMPLING_MODES",
    "LOG_RATIO_CLAMP",
    "NonFiniteLossError",
    "PolicyLossSettings",
    "aggregate",
    "cispo",
    "importance_weight",
    "policy_loss",
    "ppo_clip",
    "register_policy_loss",
    "sampling_mismatch",
    "sft_loss",
    "truncated_importance_weight",
]

#: Log-ratios are clamped to +-this before exponentiation, so one wild token cannot
#: overflow the ratio (exp(20) is about 5e8).
LOG_RATIO_CLAMP = 20.0

#: How ``rl.importance_sampling_cap`` corrects the sampler/trainer gap (TRL's
#: ``vllm_importance_sampling_mode``): per token or per completion, truncating the ratio
#: at the cap or masking (zeroing) what lies above it. The first is the default.
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite; raised instead of stepping on garbage."""


@dataclass(frozen=True)
class PolicyLossSettings:
    """The loss knobs of the ``rl`` section."""

    #: A registered policy loss's name (``rl.loss_type``).
    loss_type: str
    epsilon: float
    epsilon_high: float
    beta: float
    #: Truncated importance sampling between sampler and trainer (None: off).
    importance_sampling_cap: float | None = None
    #: How the cap applies (:data:`IMPORTANCE_SAMPLING_MODES`); read only with a cap.
    importance_sampling_mode: str = "token_truncate"
    #: How the masked per-token terms are averaged (``rl.loss_aggregation``, one of
    #: :data:`art_hydra.config.policy_losses.LOSS_AGGREGATIONS`; see :func:`aggregate`).
    aggregation: str = "dapo"
    #: ``rl.max_completion_length``: dr_grpo's constant per completion.
    max_completion_length: int = 0

    @classmethod
    def from_config(cls, rl_cfg) -> PolicyLossSettings:  # type: ignore[no-untyped-def]
        """PPO-clip's upper range defaults to epsilon; CISPO's cap is required (validated).
        The importance-sampling mode is read only where the cap is set: without a cap
        there is no correction for it to shape."""
        high = rl_cfg.epsilon if rl_cfg.epsilon_high is None else rl_cfg.epsilon_high
        cap = rl_cfg.importance_sampling_cap
        name = str(getattr(rl_cfg.loss_type, "name", rl_cfg.loss_type))
        mode = "token_truncate"
        if cap is not None:
            chosen = rl_cfg.importance_sampling_mode
            mode = str(getattr(chosen, "name", chosen))
        aggregation = str(getattr(rl_cfg.loss_aggregation, "name", rl_cfg.loss_aggregation))
        return cls(
            name,
            rl_cfg.epsilon,
            high,
            rl_cfg.beta,
            cap,
            mode,
            aggregation,
            rl_cfg.max_completion_length,
        )


@register_policy_loss(
    "ppo_clip",
    settings=("epsilon", "epsilon_high"),
    help="PPO's clipped ratio: -min(r A, clip(r, 1 - epsilon, 1 + epsilon_high) A).",
)
def ppo_clip(
    ratio: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    settings: PolicyLossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO-clip: ``-min(r A, clip(r, 1-eps, 1+eps_high) A)``; ``clip_fraction`` counts the
    tokens in a clipped region (ratio below 1-eps with A < 0, or above 1+eps_high with
    A > 0)."""
    import torch

    clipped = ratio.clamp(1 - settings.epsilon, 1 + settings.epsilon_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    with torch.no_grad():
        clip_low = (ratio < 1 - settings.epsilon) & (advantages < 0)
        clip_high = (ratio > 1 + settings.epsilon_high) & (advantages > 0)
    return per_token, {"clip_fraction": clip_low | clip_high}


@register_policy_loss(
    "cispo",
    settings=("epsilon_high",),
    requires={"epsilon_high": 5.0},
    why={
        "epsilon_high": "CISPO caps each token's importance weight at rl.epsilon_high itself "
        "(TRL's convention); falling back to rl.epsilon would cap even on-policy tokens "
        "(weight 1) and scale every gradient down. 5.0 is ScaleRL's cap."
    },
    metrics=("cispo_capped_fraction",),
    help="CISPO: the importance weight min(r, epsilon_high), detached, times A log p.",
)
def cispo(
    ratio: torch.Tensor,
    logprobs: torch.Tensor,
    advantages: torch.Tensor,
    settings: PolicyLossSettings,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO: the importance weight ``min(r, eps_high)`` (TRL's convention: the cap is
    ``epsilon_high`` itself) is detached and multiplies ``A log p``, so capped tokens
    still pass gradient; ``clip_fraction`` counts the capped tokens with A > 0, as TRL's
    ``cispo_clip_ratio`` does (so the two compare), and ``cispo_capped_fraction`` the
    capped tokens of either sign (every token whose weight the cap lowered)."""
    import torch

    weight = ratio.clamp(max=settings.epsilon_high).detach()
    per_token = -weight * advantages * logprobs
    with torch.no_grad():
        capped = ratio > settings.epsilon_high
    return per_token, {"clip_fraction": capped & (advantages > 0), "cispo_capped_fraction": capped}


def truncated_importance_weight(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """TRL's truncated importance sampling (``token_truncate``): per token
    ``min(exp(old - sampler), cap)``, detached. The sampler drew from its own
    distribution; where its numerics differ from the training side's, this reweights each
    token towards the distribution the loss assumes, and the cap bounds the variance."""
    import torch

    keep = mask > 0
    delta = torch.where(keep, old_logprobs.detach() - sampler_logprobs, 0.0)
    return torch.exp(delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)).clamp(max=cap)


def importance_weight(
    old_logprobs: torch.Tensor,
    sampler_logprobs: torch.Tensor,
    mask: torch.Tensor,
    seq_ids: torch.Tensor,
    cap: float,
    mode: str = "token_truncate",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The detached weight of each token's policy term under ``rl.importance_sampling_mode``
    (TRL's ``vllm_importance_sampling_mode``), and its statistics.

    ``token_truncate`` is :func:`truncated_importance_weight`, bit for bit. ``token_mask``
    keeps each token's ``exp(old - sampler)`` where it is at most ``cap`` and zeroes it
    above: an outlier token is dropped rather than downweighted. The ``sequence_*`` modes
    take one ratio per completion, ``exp`` of the sum of its trained tokens' log-ratios
    (the probability of the whole completion under the trainer over the sampler's), and
    truncate or mask it likewise; every token of the completion carries it.

    Completions are told apart by ``seq_ids`` within each row (a packed row holds several;
    a shared prompt has an id of its own and no trained token, see
    :func:`art_hydra.engine.packing.pack`); only positions in ``mask`` enter the sums.
    Each token's log-ratio, and each completion's sum, is clamped to
    +-:data:`LOG_RATIO_CLAMP`, so ``exp`` cannot overflow. The mask modes report
    ``importance_sampling_masked_fraction``: the share of trained tokens given weight 0.
    """
    import torch

    if mode == "token_truncate":
        return truncated_importance_weight(old_logprobs, sampler_logprobs, mask, cap), {}
    if mode not in IMPORTANCE_SAMPLING_MODES:
        known = ", ".join(IMPORTANCE_SAMPLING_MODES)
        raise ValueError(f"rl.importance_sampling_mode={mode!r} is not one of {known}")
    with torch.no_grad():
        keep = mask > 0
        delta = torch.where(keep, old_logprobs.detach() - sampler_logprobs, 0.0)
        log_ratio = delta.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        if mode.startswith("sequence_"):
            log_ratio = torch.where(keep, _per_completion_sum(log_ratio, seq_ids), 0.0)
            log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        ratio = torch.exp(log_ratio)
        if mode.endswith("_truncate"):
            return ratio.clamp(max=cap), {}
        above = ratio > cap
        dropped = float((above & keep).sum()) / max(float(keep.sum()), 1.0)
        weight = ratio.masked_fill(above, 0.0)
    return weight, {"importance_sampling_masked_fraction": dropped}


def _per_completion_sum(values: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """At each position, the sum of ``values`` over the positions of its row with the
    same sequence id: one scatter-add into a (row, id) slot each, read back by gather.
    Padding (id -1) shares id 0's slot; callers pass 0 at every untrained position, so
    it adds nothing there."""
    import torch

    rows = seq_ids.shape[0]
    ids = seq_ids.clamp(min=0)
    width = int(ids.max()) + 1 if ids.numel() else 1
    key = ids + width * torch.arange(rows, device=ids.device).unsqueeze(-1)
    sums = torch.zeros(rows * width, dtype=values.dtype, device=values.device)
    sums.index_add_(0, key.flatten(), values.flatten())
    return sums[key]


def sampling_mismatch(
    old_logprobs: torch.Tensor, sampler_logprobs: torch.Tensor, mask: torch.Tensor
) -> dict[str, float]:
    """Mean and largest ``|old - sampler|`` logprob over the trained tokens: how far the
    rollouts' own logprobs are from the training side's for the same policy (precision,
    kernels, cache versus full forward). 0 only where both compute alike bit for bit."""
    import torch

    keep = mask > 0
    with torch.no_grad():
        gap = torch.where(keep, (old_logprobs.detach() - sampler_logprobs).abs(), 0.0)
        if gap.numel() == 0:
            return {"sampling_mismatch_mean": 0.0, "sampling_mismatch_max": 0.0}
        masked = mask.sum().clamp(min=1)
        # One read of both: the gap is 0 off the trained tokens and never negative, so
        # its max is 0 where none is trained, without asking first.
        mean, largest = torch.stack([(gap * mask).sum() / masked, gap.max()]).tolist()
        return {"sampling_mismatch_mean": mean, "sampling_mismatch_max": largest}


def aggregate(
    per_token: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicyLossSettings,
    num_tokens: float,
    seq_ids: torch.Tensor | None = None,
    completions: int = 0,
) -> torch.Tensor:
    """The micro-batch's loss from its per-token terms, as ``rl.loss_aggregation`` (TRL
    1.16's ``_compute_loss`` normalisations, one micro-batch per optimizer step):

    - ``dapo``: the masked sum / ``num_tokens``, the step's share of the generation
      batch's trained tokens over every rank (set by the producer and
      ``ranks.ProcessGroup.normalise``); the expression art_hydra always used.
    - ``bnpo``: the masked sum / this micro-batch's trained tokens.
    - ``grpo``: each completion's masked sum / its trained tokens, then the mean over
      ``completions`` (one with no trained token counts, adding 0, as in TRL).
    - ``dr_grpo``: the masked sum / (``completions`` x ``rl.max_completion_length``).

    The last three are this rank's own means, as in TRL, where DDP then averages the
    ranks' gradients (as art_hydra's DDP and FSDP do). Completions are told apart by
    ``seq_ids`` (ids ``0..completions-1``, see :func:`art_hydra.engine.packing.pack`; a
    shared prompt's higher id trains no token); without them each row is one, as in
    TRL's unpacked [completions, tokens] layout; ``completions`` 0 counts the ids
    holding a trained token.
    """
    import torch

    chosen = settings.aggregation
    masked = per_token * mask
    if chosen == "dapo":
        return masked.sum() / num_tokens
    if chosen == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if seq_ids is None:
        rows = torch.arange(mask.shape[0], device=mask.device).unsqueeze(-1)
        seq_ids = rows.expand_as(mask)
    ids = seq_ids.clamp(min=0).flatten()  # padding (-1) trains nothing: any slot does
    if not completions:
        completions = int(torch.unique(ids[mask.flatten() > 0]).numel())
    if chosen == "dr_grpo" and settings.max_completion_length > 0:
        return masked.sum() / (max(completions, 1) * settings.max_completion_length)
    if chosen != "grpo":
        known = ", ".join(LOSS_AGGREGATIONS)
        raise ValueError(
            f"rl.loss_aggregation={chosen!r} with rl.max_completion_length="
            f"{settings.max_completion_length}: the aggregation is one of {known}, and "
            "dr_grpo divides by a positive rl.max_completion_length"
        )
    width = int(ids.max()) + 1 if ids.numel() else 1
    zeros = torch.zeros(width, dtype=masked.dtype, device=masked.device)
    sums = zeros.index_add(0, ids, masked.flatten())
    counts = zeros.index_add(0, ids, mask.flatten().to(masked.dtype))
    return (sums / counts.clamp(min=1.0)).sum() / max(completions, 1)


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    settings: PolicyLossSettings,
    num_tokens: float,
    ref_logprobs: torch.Tensor | None = None,
    importance_weight: torch.Tensor | None = None,
    seq_ids: torch.Tensor | None = None,
    completions: int = 0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token losses (policy and KL terms) over ``mask``, averaged by :func:`aggregate`
    (``num_tokens``: dapo's denominator; ``seq_ids``, ``completions``: grpo's, dr_grpo's).

    ``importance_weight`` (:func:`importance_weight`) multiplies each token's
    policy term, not the KL term, as TRL applies its vLLM importance-sampling correction.

    The per-token policy term comes from the loss registered as ``settings.loss_type``
    (:func:`ppo_clip`, :func:`cispo`, or one a user registered); each boolean tensor it
    returns is logged as the fraction of trained tokens it marks. With ``beta > 0`` the
    k3 estimator of KL(policy || reference) is added.
    """
    import torch

    chosen = get_policy_loss(settings.loss_type)
    if chosen is None:
        raise ValueError(f"rl.loss_type={settings.loss_type!r} is not a registered policy loss")
    # Positions outside the mask (padding, prompts, a sequence's last token) may hold
    # -inf logprobs (suppressed or filtered targets); zero them so they add exactly 0.
    keep = mask > 0
    logprobs = torch.where(keep, logprobs, torch.zeros_like(logprobs))
    old_logprobs = torch.where(keep, old_logprobs, torch.zeros_like(old_logprobs))
    if ref_logprobs is not None:
        ref_logprobs = torch.where(keep, ref_logprobs, torch.zeros_like(ref_logprobs))
    log_ratio = (logprobs - old_logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    per_token, flags = chosen.fn(ratio, logprobs, advantages, settings)
    if importance_weight is not None:
        per_token = per_token * importance_weight
    kl = torch.zeros_like(per_token)
    if settings.beta > 0 and ref_logprobs is not None:
        delta = (ref_logprobs - logprobs).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + settings.beta * kl
    loss = aggregate(per_token, mask, settings, num_tokens, seq_ids, completions)
    if not torch.isfinite(loss):
        worst_ratio = log_ratio[keep].abs().max().item() if keep.any() else 0.0
        worst_adv = advantages[keep].abs().max().item() if keep.any() else 0.0
        raise NonFiniteLossError(
            f"the RL loss is {loss.item()} (largest |log-ratio| {worst_ratio:.3g}, largest "
            f"|advantage| {worst_adv:.3g} over trained tokens); the step was not taken"
        )
    masked = mask.sum().clamp(min=1)
    with torch.no_grad():
        stats = {"kl": float((kl * mask).sum() / masked), "clip_fraction": 0.0}
        for name, tokens in flags.items():
            stats[name] = float((tokens.float() * mask).sum() / masked)
    return loss, stats


def sft_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """Cross-entropy on masked tokens, divided by the step's token count."""
    import torch

    logprobs = torch.where(mask > 0, logprobs, torch.zeros_like(logprobs))
    loss = -(logprobs * mask).sum() / num_tokens
    if not torch.isfinite(loss):
        raise NonFiniteLossError(f"the SFT loss is {loss.item()}; the step was not taken")
    return loss, {"kl": 0.0, "clip_fraction": 0.0}
