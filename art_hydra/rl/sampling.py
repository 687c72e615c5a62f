"""Logits processing shared by rollouts and training, and the rollout sampler.

The same :func:`process_logits` turns raw logits into the sampling distribution when
rollouts are drawn and when training computes logprobs. If the two differed (a
temperature applied on one side only, a top-k mask on one side only), the importance
ratio of some tokens would be astronomically large, the loss non-finite, and the next
generation would crash.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class SamplingSettings:
    """How logits become a distribution (from the ``rl`` section)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    #: Token ids never sampled (padding, BOS, UNK): masked out on both sides.
    suppress_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, rl_cfg: Any, suppress_ids: tuple[int, ...] = ()) -> SamplingSettings:
        return cls(rl_cfg.temperature, rl_cfg.top_k, rl_cfg.top_p, tuple(suppress_ids))


def process_logits(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Suppressed ids, temperature, top-k and top-p on the last dimension (float32 out)."""
    logits = logits.float() / settings.temperature
    if settings.suppress_ids:
        logits = logits.clone()
        logits[..., list(settings.suppress_ids)] = float("-inf")
    if settings.top_k > 0 and settings.top_k < logits.shape[-1]:
        kth = torch.topk(logits, settings.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if settings.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # Drop a token when the mass before it already reaches top_p (keep at least one).
        drop_sorted = (probs.cumsum(-1) - probs) >= settings.top_p
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


def suppressed_ids(tokenizer: Any) -> tuple[int, ...]:
    """Special tokens a completion should never contain (EOS excepted)."""
    ids = {tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.unk_token_id}
    ids.discard(None)
    ids.discard(tokenizer.eos_token_id)
    return tuple(sorted(ids))


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, settings: SamplingSettings
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target under the processed distribution, and its entropy."""
    logp = torch.log_softmax(process_logits(logits, settings), dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    probs = logp.exp()
    entropy = -(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum(-1)
    return chosen, entropy


def _cache_argument(model: Any) -> str:
    """The KV-cache keyword: ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return (
        "cache"
        if "cache" in inspect.signature(type(base).forward).parameters
        else ("past_key_values")
    )


@torch.no_grad()
def sample(
    model: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    settings: SamplingSettings,
    stop_ids: tuple[int, ...],
    pad_id: int,
    generator: torch.Generator,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt (KV cache, left padding).

    Returns the completion tokens (ending with the stop token when the model stopped)
    and the logprob of each under the processed distribution it was drawn from.
    """
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        attention[row, width - len(prompt) :] = 1
    ids, attention = ids.to(device), attention.to(device)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)
    cache_arg = _cache_argument(model)
    out = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=True)
    past, logits = getattr(out, cache_arg), out.logits[:, -1]
    stops = torch.tensor(stop_ids, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    position = positions[:, -1:]
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(process_logits(logits, settings), dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        tokens.append(torch.where(done, pad_id, nxt))
        logprobs.append(logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
        done = done | torch.isin(nxt, stops)
        if bool(done.all()):
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
        position = position + 1
        out = model(
            input_ids=nxt.unsqueeze(-1),
            attention_mask=attention,
            position_ids=position,
            use_cache=True,
            **{cache_arg: past},
        )
        past, logits = getattr(out, cache_arg), out.logits[:, -1]
    token_rows = torch.stack(tokens, dim=1).tolist()
    logprob_rows = torch.stack(logprobs, dim=1).tolist()
    completions, completion_logprobs = [], []
    for row_tokens, row_logprobs in zip(token_rows, logprob_rows, strict=True):
        ends = [i for i, t in enumerate(row_tokens) if t in stop_ids]
        end = ends[0] + 1 if ends else len(row_tokens)
        completions.append(row_tokens[:end])
        completion_logprobs.append(row_logprobs[:end])
    return completions, completion_logprobs
