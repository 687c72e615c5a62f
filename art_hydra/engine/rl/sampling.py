"""Logits processing shared by rollouts and training, and the rollout sampler.

Every logprob (recorded at sampling, computed in training, and for the reference) is
taken under one distribution, :func:`logprob_logits`: the temperature-scaled logits
with the never-sampled special tokens removed. If the sides differed (a temperature on
one side only), the importance ratio of some tokens would be astronomically large and
the loss non-finite.

Top-k and top-p only choose which tokens may be *drawn* (:func:`process_logits`), as in
TRL: a logprob under the truncated distribution is -inf for any token outside the
top-k/top-p set, which the reference (or the policy after an update, or the same policy
in bf16) can easily put a sampled token into; the KL would be stuck at infinity and the
loss non-finite. Under the untruncated distribution every sampled token has a finite
logprob on every side.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from art_hydra.errors import InvalidDistributionError, RunStopped, StallError

if TYPE_CHECKING:
    from art_hydra.config.schema import RLConfig


@dataclass(frozen=True)
class SamplingSettings:
    """How logits become a distribution (from the ``rl`` section)."""

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    #: Token ids never sampled (padding, BOS, UNK): masked out on both sides.
    suppress_ids: tuple[int, ...] = ()

    @classmethod
    def from_config(cls, rl_cfg: RLConfig, suppress_ids: tuple[int, ...] = ()) -> SamplingSettings:
        return cls(rl_cfg.temperature, rl_cfg.top_k, rl_cfg.top_p, tuple(suppress_ids))

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p narrows the distribution tokens are drawn from."""
        return self.top_k > 0 or self.top_p < 1.0


@functools.lru_cache(maxsize=16)
def _id_index(ids: tuple[int, ...], device: torch.device) -> torch.Tensor:
    # Kept for training too, so never an inference tensor, even when sampling makes it.
    with torch.inference_mode(False):
        return torch.tensor(ids, dtype=torch.long, device=device)


def logprob_logits(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """Temperature and suppressed ids on the last dimension (float32 out): the
    distribution every logprob is taken under (no top-k/top-p, see the module doc).

    May return ``logits`` itself (float32, temperature 1, nothing suppressed): callers
    never write into the result. Dividing by 1.0 changes no bit, so it is skipped; the
    ids are filled out of place in one op (this runs once per sampled token).
    """
    logits = logits.float()
    if settings.temperature != 1.0:
        logits = logits / settings.temperature
    if settings.suppress_ids:
        index = _id_index(settings.suppress_ids, logits.device)
        logits = logits.index_fill(-1, index, float("-inf"))
    return logits


def process_logits(logits: torch.Tensor, settings: SamplingSettings) -> torch.Tensor:
    """The distribution tokens are drawn from: :func:`logprob_logits` narrowed by top-k
    and top-p (float32 out)."""
    logits = logprob_logits(logits, settings)
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
    """Logprob of each target under :func:`logprob_logits` (differentiable), and that
    distribution's entropy (a statistic: no gradient, so autograd records none of it)."""
    logp = torch.log_softmax(logprob_logits(logits, settings), dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    with torch.no_grad():
        probs = logp.exp()
        entropy = -(probs * torch.where(probs > 0, logp, torch.zeros_like(logp))).sum(-1)
    return chosen, entropy


@functools.lru_cache(maxsize=32)
def _forward_keywords(model_class: type) -> frozenset[str]:
    return frozenset(inspect.signature(model_class.forward).parameters)


def _base_class(model: Any) -> type:
    """The class whose forward takes the model's keywords (LoRA unwrapped: a PeftModel's
    base model, or a LoraModel's wrapped model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    base = getattr(base, "model", base) if type(base).__name__ == "LoraModel" else base
    return type(base)


def _cache_argument(model: Any) -> str:
    """The KV-cache keyword: ``cache`` in transformers >= 5.2x, ``past_key_values`` before."""
    return "cache" if "cache" in _forward_keywords(_base_class(model)) else "past_key_values"


def _last_logits_only(model: Any) -> dict[str, int]:
    """Ask the prompt pass for the last position's logits only, where the model can: a
    real vocabulary (150k) over every prompt token would be the largest tensor of the
    step, and only the last position is sampled from."""
    keywords = _forward_keywords(_base_class(model))
    return {"logits_to_keep": 1} if "logits_to_keep" in keywords else {}


class _RolloutDeadline:
    """The rollout deadline, checked between decoding steps."""

    def __init__(self, timeout_s: float | None) -> None:
        self.timeout_s = timeout_s
        self.deadline = None if timeout_s is None else time.monotonic() + timeout_s

    def check(self, generated: int, wanted: int) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise StallError(
                f"sampling the generation batch did not finish within {self.timeout_s:g}s "
                f"(timeouts.rollout_s); it stood at {generated} of {wanted} new tokens."
            )


# Inference mode, not just no_grad: no version counters or autograd bookkeeping on the
# many small ops of decoding (about 12% of sampling on the tiny model). Nothing made here
# outlives the call but Python lists, so no inference tensor reaches training.
@torch.inference_mode()
def sample(
    model: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    settings: SamplingSettings,
    stop_ids: tuple[int, ...],
    pad_id: int,
    generator: torch.Generator,
    left_padding: bool = True,
    timeout_s: float | None = None,
) -> tuple[list[list[int]], list[list[float]]]:
    """Sample one completion per prompt (KV cache), within ``timeout_s`` seconds
    (``timeouts.rollout_s``; checked after every decoding step).

    Returns the completion tokens (ending with the stop token when the model stopped)
    and the logprob of each under :func:`logprob_logits` (drawn with top-k/top-p).

    With ``left_padding`` prompts of different lengths share one left-padded batch with
    explicit positions. Without it (models whose convolutional or recurrent layers would
    run through the padding), prompts are batched by length, which needs no padding.
    """
    deadline = _RolloutDeadline(timeout_s)
    if left_padding or len({len(p) for p in prompts}) == 1:
        return _sample_batch(
            model, prompts, max_new_tokens, settings, stop_ids, pad_id, generator, deadline
        )
    by_length: dict[int, list[int]] = {}
    for index, prompt in enumerate(prompts):
        by_length.setdefault(len(prompt), []).append(index)
    completions: list[list[int]] = [[] for _ in prompts]
    logprobs: list[list[float]] = [[] for _ in prompts]
    for indices in by_length.values():
        group = [prompts[i] for i in indices]
        try:
            tokens, values = _sample_batch(
                model, group, max_new_tokens, settings, stop_ids, pad_id, generator, deadline
            )
        except InvalidDistributionError as exc:  # name the completions as the caller does
            raise exc.remapped(indices, len(prompts)) from None
        for i, row_tokens, row_values in zip(indices, tokens, values, strict=True):
            completions[i], logprobs[i] = row_tokens, row_values
    return completions, logprobs


def _distinct(prompts: list[list[int]]) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts (first-seen order), and which of them each prompt is."""
    index: dict[tuple[int, ...], int] = {}
    which = [index.setdefault(tuple(p), len(index)) for p in prompts]
    return [list(p) for p in index], which


#: Model classes (LoRA unwrapped) whose cache cannot copy rows, found at their first
#: prompt pass: their prompts are read once per completion from then on, without trying.
_ROWS_FIXED: set[type] = set()


def _state_holders(cache: Any) -> list[dict[str, Any]]:
    """The attributes of the cache object and of each of its layers: everything that may
    hold batch-sized state (key/value rows, convolution and recurrent states, a linear
    attention cache). The cache's list of layers itself is not a state."""
    holders = [cache, *(getattr(cache, "layers", None) or [])]
    return [getattr(holder, "__dict__", {}) for holder in holders]


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in an attribute: itself, or the entries of a list, tuple or dict
    (hybrid layers keep one conv and one recurrent state per state index in dicts)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _select(value: Any, rows: torch.Tensor, size: int) -> Any:
    """``value`` with every tensor whose first dimension is ``size`` (the distinct
    prompts) indexed by ``rows``; anything else as it was."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 0 and value.shape[0] == size:
            return value.index_select(0, rows.to(value.device))
        return value
    if isinstance(value, dict):
        return {key: _select(item, rows, size) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_select(item, rows, size) for item in value)
    return value


def _copy_rows(cache: Any, rows: torch.Tensor, size: int) -> bool:
    """Give each completion its prompt's state: index every batch-sized tensor of the
    cache and its layers by ``rows`` (key/value rows, conv and SSM/recurrent states
    alike), then check that every state tensor has one row per completion.

    transformers' own ``batch_select_indices`` cannot be trusted for this: a hybrid layer
    (Falcon-H1's attention + Mamba layer in 5.2x) inherits the key/value version and
    leaves its conv/SSM states at the distinct count, which crashes (or, worse, runs)
    the first decoding step. False when some state is not one row per completion after
    the copy (a layout this walk does not know): the caller then reads every copy of
    the prompts instead, which is always right.
    """
    holders = _state_holders(cache)
    for attributes in holders:
        for name, value in list(attributes.items()):
            if name != "layers" and _tensors(value):
                attributes[name] = _select(value, rows, size)
    states = [
        tensor
        for attributes in holders
        for name, value in attributes.items()
        if name != "layers"
        for tensor in _tensors(value)
        if tensor.dim() > 0
    ]
    return bool(states) and all(state.shape[0] == len(rows) for state in states)


def _no_cache(model: Any) -> RunStopped:
    name = _base_class(model).__name__
    return RunStopped(
        f"{name} returned no cache from its prompt pass (use_cache=True), so rollouts cannot "
        "be sampled token by token: this family's cache is not one transformers' generation "
        "loop exposes (a recurrent state of its own). algorithm=sft trains it without "
        "sampling."
    )


def _left_padded(
    prompts: list[list[int]], pad_id: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Token ids, padding mask and positions of ``prompts`` left-padded to the longest."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts], device=device)
    attention = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
    )
    return ids, attention, (attention.cumsum(-1) - 1).clamp(min=0)


def _draw(
    probs: torch.Tensor,
    generator: torch.Generator,
    position: int = 0,
    active: torch.Tensor | None = None,
    logits: torch.Tensor | None = None,
    settings: SamplingSettings | None = None,
) -> torch.Tensor:
    """One token per row, as ``torch.multinomial(probs, 1)`` draws it (the same
    exponential race on the same generator, so the same tokens).

    ``multinomial`` checks its rows with four reductions and two host syncs; this checks
    them with one reduction (each row's min) and one sync, reading the rest from the
    race's own winner (its score: NaN, infinite or zero for a row that holds one): a NaN,
    infinite or negative probability, or a row of zeros, raises
    :class:`InvalidDistributionError` naming the rows (among ``active`` ones: finished
    completions are not drawn for), the decoding step ``position``, and the likely cause
    read from the raw ``logits`` under ``settings`` (see :func:`_likely_cause`).
    Unchecked, the race would draw the pad id from such a row and the run would fail
    later, as a loss error.
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    scores = probs / race  # the race is positive: a NaN or inf probability wins it
    tokens = scores.argmax(-1)  # (max(-1) with indices is ~100x slower on CPU here)
    best = scores.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    low = probs.amin(-1)
    bad = ~((low >= 0) & (best > 0) & (best < float("inf")))  # a NaN fails every test
    if active is not None:
        bad = bad & active
    if bool(bad.any()):
        raise _invalid(probs, bad, position, logits, settings)
    return tokens


def _invalid(
    probs: torch.Tensor,
    bad: torch.Tensor,
    position: int,
    logits: torch.Tensor | None,
    settings: SamplingSettings | None,
) -> InvalidDistributionError:
    """The error for the rows ``bad`` (off the fast path: a failing run only)."""
    rows = [int(r) for r in bad.nonzero().flatten()]
    row = probs[rows[0]].float()
    if torch.isnan(row).any():
        problem = "NaN"
    elif torch.isinf(row).any():
        problem = "infinite"
    elif (row < 0).any():
        problem = "negative"
    else:
        problem = "all-zero"
    cause = _likely_cause(None if logits is None else logits[rows[0]], settings)
    return InvalidDistributionError(rows, probs.shape[0], position, problem, cause)


def _likely_cause(logits: torch.Tensor | None, settings: SamplingSettings | None) -> str:
    """Why one row's distribution failed, read from the model's raw logits for it and the
    processing they went through (model first, then suppression, temperature, top-k/p)."""
    if logits is None or settings is None:
        return "the probabilities handed to the draw were not a distribution."
    raw = logits.float()
    if torch.isnan(raw).any():
        return (
            "the model's logits are NaN: its weights or activations diverged (a NaN or "
            "infinite update; under model.dtype=float16, an overflow in the forward). Resume "
            "from an earlier checkpoint with a lower trainer.learning_rate or "
            "trainer.max_grad_norm, or use float32 or bfloat16."
        )
    if torch.isinf(raw).any():
        return (
            "the model's logits are infinite: float16 overflowed in the forward "
            "(model.dtype=float16), or the weights diverged. Use float32 or bfloat16, or a "
            "lower trainer.learning_rate."
        )
    unscaled = logprob_logits(raw, dataclasses.replace(settings, temperature=1.0))
    if bool(torch.isneginf(unscaled).all()):
        return (
            f"every token was removed: the never-sampled special ids "
            f"({len(settings.suppress_ids)} of them) cover the vocabulary."
        )
    if not bool(torch.isfinite(logprob_logits(raw, settings).max())):
        return (
            f"rl.temperature={settings.temperature:g} is so small that the logits divided by "
            "it overflow float32; raise rl.temperature."
        )
    if bool(torch.isneginf(process_logits(raw, settings)).all()):
        return (
            f"rl.top_k={settings.top_k} / rl.top_p={settings.top_p:g} removed every token; "
            "raise them."
        )
    return "the probabilities handed to the draw were not a distribution."


def _sample_batch(
    model: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    settings: SamplingSettings,
    stop_ids: tuple[int, ...],
    pad_id: int,
    generator: torch.Generator,
    deadline: _RolloutDeadline,
) -> tuple[list[list[int]], list[list[float]]]:
    """One batch of prompts, left-padded to the longest (see :func:`sample`).

    A prompt repeated for its group (``num_generations`` times) is read once: the prompt
    pass runs on the distinct prompts, and its cache rows and last logits are copied to
    each completion before decoding, where the rows part ways.
    """
    device = next(model.parameters()).device
    # Unpadded, decoding passes no mask (the model's own causal mask is the same): state
    # space layers (Mamba) read a passed mask as per-token padding of the new token's
    # input and gave wrong logprobs with the growing prompt-plus-completion mask.
    padded = len({len(p) for p in prompts}) > 1
    cache_arg = _cache_argument(model)
    past, logits, attention, positions = _read_prompts(model, prompts, pad_id, device, cache_arg)
    stops = torch.tensor(stop_ids, device=device)
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    tokens: list[torch.Tensor] = []
    logprobs: list[torch.Tensor] = []
    position = positions[:, -1:]
    for generated in range(max_new_tokens):
        deadline.check(generated, max_new_tokens)
        logp = torch.log_softmax(logprob_logits(logits, settings), dim=-1)
        draw = (
            torch.log_softmax(process_logits(logits, settings), -1) if settings.truncates else logp
        )
        nxt = _draw(draw.exp(), generator, generated, ~done, logits, settings)
        tokens.append(torch.where(done, pad_id, nxt))
        logprobs.append(logp.gather(-1, nxt.unsqueeze(-1)).squeeze(-1))
        done = done | torch.isin(nxt, stops)
        if bool(done.all()):
            break
        attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)
        position = position + 1
        out = model(
            input_ids=nxt.unsqueeze(-1),
            position_ids=position,
            use_cache=True,
            **({"attention_mask": attention} if padded else {}),
            **{cache_arg: past},
        )
        past, logits = getattr(out, cache_arg), out.logits[:, -1]
    token_rows = torch.stack(tokens, dim=1).tolist()
    logprob_rows = torch.stack(logprobs, dim=1).tolist()
    return _cut_at_stops(token_rows, logprob_rows, stop_ids)


def _read_prompts(
    model: Any, prompts: list[list[int]], pad_id: int, device: torch.device, cache_arg: str
) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prompt pass of :func:`_sample_batch`: its cache, and per completion row the
    last position's logits, attention mask and positions.

    Repeated prompts are read once and their cache rows copied to each completion; a
    model whose cache rows cannot all be copied is remembered (``_ROWS_FIXED``) and reads
    every copy of the prompts, now and from then on.
    """
    distinct, which = _distinct(prompts)
    last_only = _last_logits_only(model)
    out = None
    if len(distinct) < len(prompts) and _base_class(model) not in _ROWS_FIXED:
        out, attention, positions = _prompt_pass(model, distinct, pad_id, device, last_only)
        rows = torch.tensor(which, device=device)
        if getattr(out, cache_arg, None) is None:
            raise _no_cache(model)
        if _copy_rows(getattr(out, cache_arg), rows, len(distinct)):
            logits = out.logits[:, -1].index_select(0, rows)
            attention, positions = attention[rows], positions[rows]
        else:  # a cache whose rows cannot all be copied: read every copy of the prompts
            _ROWS_FIXED.add(_base_class(model))
            out = None
    if out is None:
        out, attention, positions = _prompt_pass(model, prompts, pad_id, device, last_only)
        logits = out.logits[:, -1]
    past = getattr(out, cache_arg, None)
    if past is None:
        raise _no_cache(model)
    return past, logits, attention, positions


def _prompt_pass(
    model: Any,
    batch: list[list[int]],
    pad_id: int,
    device: torch.device,
    last_only: dict[str, int],
) -> tuple[Any, torch.Tensor, torch.Tensor]:
    """One forward over ``batch``'s prompts, left-padded, filling the cache that decoding
    goes on from; also the mask and positions it used, which decoding extends."""
    ids, attention, positions = _left_padded(batch, pad_id, device)
    out = model(
        input_ids=ids,
        attention_mask=attention,
        position_ids=positions,
        use_cache=True,
        **last_only,
    )
    return out, attention, positions


def _cut_at_stops(
    token_rows: list[list[int]], logprob_rows: list[list[float]], stop_ids: tuple[int, ...]
) -> tuple[list[list[int]], list[list[float]]]:
    """Each row's tokens and logprobs up to and including its first stop token (all of
    them where none stopped it): rows that stopped early were padded while the others
    went on decoding."""
    completions, completion_logprobs = [], []
    for row_tokens, row_logprobs in zip(token_rows, logprob_rows, strict=True):
        ends = [i for i, t in enumerate(row_tokens) if t in stop_ids]
        end = ends[0] + 1 if ends else len(row_tokens)
        completions.append(row_tokens[:end])
        completion_logprobs.append(row_logprobs[:end])
    return completions, completion_logprobs
