"""Training logprobs with memory bounded in the vocabulary: the head runs only where a
token is trained, in chunks whose logits the backward recomputes.

The plain way (the model's forward, then a log-softmax over ``[tokens x vocab]``) holds
about four float32 copies of the logits of *every* position, prompts included: 2.6 GB
per 1,024 tokens at a 151,936-token vocabulary, more than the rest of a small model's
step. :class:`PolicyLogprobs` runs the model's backbone to its last hidden states, keeps
the rows of trained positions (``loss_mask > 0``), and applies the head (with the
family's logit post-processing and :func:`~art_hydra.engine.rl.sampling.logprob_logits`) in
chunks of about :data:`CHUNK_ELEMENTS` logits (more on an accelerator) under
``torch.utils.checkpoint``: only one chunk's logits exist at a time, forward and
backward. The result is the same
logprobs and gradients as the plain path (the same ops on the same rows).

A model whose head this module does not know (post-processing outside the table of
:func:`logit_transform`, a backbone ``get_decoder`` does not find) is caught by a
one-time check per model class against its own forward on a tiny input, and then takes
the plain path, with one warning: every family stays correct, the known ones lean.

Contract: logprob and entropy at trained positions, 0 elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from art_hydra import moved
from art_hydra.engine.rl.sampling import SamplingSettings, logprob_logits, token_logprobs

log = moved.logger(__name__)  # the name it logged under before the move

#: Logits per chunk on the CPU (64 MiB in float32): small next to the rest of a step,
#: large enough that the head's matmul stays efficient (110 rows at a 151,936-token
#: vocabulary).
CHUNK_ELEMENTS = 1 << 24
#: Logits per chunk on an accelerator (256 MiB in float32). Each chunk costs about 0.5 ms
#: of Python and kernel launches; on an H200 with a tiny model, 2^24 took 1.4-1.7x the
#: full path's time, 2^26 1.06-1.08x at 4k-16k tokens (bench/logprob_memory.py).
ACCELERATOR_CHUNK_ELEMENTS = 1 << 26

#: Logits of the tiny input the one-time check compares (float32 weights).
CHECK_ATOL = 1e-5

#: Logit post-processing per ``model_type``, as the family's ``*ForCausalLM.forward``
#: applies it after the head: (operation, config attribute). Families with
#: ``final_logit_softcapping`` set in their config get the softcap whatever their type
#: (Gemma 2/3 and their relatives). Anything else is verified by the one-time check.
_POST_PROCESSING: dict[str, tuple[str, str]] = {
    "cohere": ("multiply", "logit_scale"),
    "cohere2": ("multiply", "logit_scale"),
    "cohere2_moe": ("multiply", "logit_scale"),
    "granite": ("divide", "logits_scaling"),
    "granite_swa": ("divide", "logits_scaling"),
    "granitemoe": ("divide", "logits_scaling"),
    "granitemoe_swa": ("divide", "logits_scaling"),
    "granitemoehybrid": ("divide", "logits_scaling"),
    "granitemoeshared": ("divide", "logits_scaling"),
    "hyperclovax": ("multiply", "logits_scaling"),
    "falcon_h1": ("multiply", "lm_head_multiplier"),
}

#: Per (model class, logit-related config values): whether the chunked head reproduces
#: the model's own logits. Filled by :func:`head_matches`.
_VERIFIED: dict[tuple[type, str], bool] = {}


def chunk_tokens(vocab: int, elements: int = CHUNK_ELEMENTS) -> int:
    """Rows per chunk so that one chunk holds about ``elements`` logits (at least 1)."""
    return max(1, elements // max(vocab, 1))


def logit_transform(config: Any) -> Callable[[torch.Tensor], torch.Tensor]:
    """The family's post-processing of the head's output, in the order and dtype its
    forward applies it (so the logits are the same bits as the model's own)."""
    scale_op = _POST_PROCESSING.get(getattr(config, "model_type", ""))
    scale = getattr(config, scale_op[1], None) if scale_op else None
    cap = getattr(config, "final_logit_softcapping", None)

    def transform(logits: torch.Tensor) -> torch.Tensor:
        if scale_op is not None and scale is not None:
            logits = logits * scale if scale_op[0] == "multiply" else logits / scale
        if cap is not None:
            logits = logits / cap
            logits = torch.tanh(logits)
            logits = logits * cap
        return logits

    return transform


class _ChunkHead:
    """One chunk: head, post-processing, logprob of each target; the entropy (a
    statistic, no gradient) is kept on the first call only, so the backward's
    recomputation of the chunk does not compute it again."""

    def __init__(
        self,
        head: torch.nn.Module,
        transform: Callable[[torch.Tensor], torch.Tensor],
        settings: SamplingSettings,
    ) -> None:
        self.head = head
        self.transform = transform
        self.settings = settings
        self.entropy: torch.Tensor | None = None

    def __call__(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        logits = self.transform(self.head(hidden))
        if self.entropy is not None:  # the backward's recomputation: logprobs only
            logp = torch.log_softmax(logprob_logits(logits, self.settings), dim=-1)
            return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        chosen, self.entropy = token_logprobs(logits, targets, self.settings)
        return chosen


#: Rows the chunked head has run on in this process's forwards (the backward's
#: recomputation not counted): tests read it to see that prompts get no logits.
HEAD_ROWS = [0]


class _Linearised(torch.autograd.Function):
    """A chunk's logprobs whose gradient with respect to the hidden rows was taken in the
    forward (``jacobian``: row i holds d logprob_i / d hidden_i, each logprob depending on
    its own row only): the backward is ``grad * jacobian``, with nothing recomputed."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, hidden: torch.Tensor, values: torch.Tensor, jacobian: torch.Tensor
    ) -> torch.Tensor:
        ctx.save_for_backward(jacobian)
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (jacobian,) = ctx.saved_tensors
        return grad.unsqueeze(-1).to(jacobian.dtype) * jacobian, None, None


def _frozen_head_chunk(
    part: _ChunkHead, hidden: torch.Tensor, targets: torch.Tensor
) -> torch.Tensor:
    """A chunk under a head without trainable parameters (LoRA without
    ``modules_to_save``): the gradient only flows to the hidden rows, so it is taken in
    the forward, one ``[rows x hidden]`` tensor, and the logits are never recomputed."""
    with torch.enable_grad():
        rows = hidden.detach().requires_grad_(True)
        values = part(rows, targets)
        (jacobian,) = torch.autograd.grad(values.sum(), rows)
    return _Linearised.apply(hidden, values.detach(), jacobian)


def chunk_logprobs(
    head: torch.nn.Module,
    transform: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    settings: SamplingSettings,
    vocab: int,
    elements: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprob of each target and the entropy, for hidden rows ``[n, hidden]``, one
    chunk of about ``elements`` logits (default :data:`CHUNK_ELEMENTS` on the CPU,
    :data:`ACCELERATOR_CHUNK_ELEMENTS` elsewhere) at a time.

    With autograd recording and several chunks, each runs under (non-reentrant)
    checkpointing: its logits are freed after the forward and recomputed in the
    backward, so they never all exist at once. A single chunk keeps its logits for the
    backward instead (the recompute, at the start of the backward, would hold the same
    logits beside the same activations). Gradient reaches ``hidden`` even when the head
    is frozen; then (no head parameter to train) the chunk's gradient is taken in the
    forward instead and nothing is recomputed.
    """
    if elements is None:
        cpu = hidden.device.type == "cpu"
        elements = CHUNK_ELEMENTS if cpu else ACCELERATOR_CHUNK_ELEMENTS
    rows = chunk_tokens(vocab, elements)
    recording = torch.is_grad_enabled()
    frozen = not any(p.requires_grad for p in head.parameters())
    # One chunk holds every row: its logits are the only ones that ever exist, so
    # recomputing them in the backward would bound nothing and cost a second head pass
    # (and checkpointing's hooks) per step; autograd keeps them instead.
    single = hidden.shape[0] <= rows
    chosen: list[torch.Tensor] = []
    entropy: list[torch.Tensor] = []
    for start in range(0, hidden.shape[0], rows):
        part = _ChunkHead(head, transform, settings)
        h, t = hidden[start : start + rows], targets[start : start + rows]
        if recording and frozen and h.requires_grad:
            value = _frozen_head_chunk(part, h, t)
        elif recording and not single:
            value = checkpoint(part, h, t, use_reentrant=False, preserve_rng_state=False)
        else:
            value = part(h, t)
        HEAD_ROWS[0] += h.shape[0]
        assert part.entropy is not None
        chosen.append(value)
        entropy.append(part.entropy)
    return torch.cat(chosen), torch.cat(entropy)


def causal_lm(model: Any) -> Any:
    """The transformers ``*ForCausalLM`` under peft (a PeftModel's base model, a
    LoraModel's wrapped model; LoRA layers stay injected in it), or ``model`` itself."""
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    if type(model).__name__ == "LoraModel":
        model = model.model
    return model


def _vocab(head: Any, config: Any) -> int:
    out = getattr(head, "out_features", None)
    if isinstance(out, int):
        return out
    weight = getattr(head, "weight", None)
    if isinstance(weight, torch.Tensor):
        return int(weight.shape[0])
    return int(getattr(config, "vocab_size", 1) or 1)


def _check_key(lm: Any) -> tuple[type, str]:
    """The class, and the config's logit-related values (a family may scale its logits
    only for some configs: the check then holds for those values only)."""
    config = lm.config
    words = ("logit", "multiplier", "softcap", "scal")
    values = {
        k: repr(v)
        for k, v in sorted(vars(config).items())
        if any(w in k for w in words) and not isinstance(v, dict)
    }
    return type(lm), repr(values)


class PolicyLogprobs(torch.nn.Module):
    """The model's logprobs (and entropy) at trained positions of packed rows.

    An ``nn.Module`` around the model, so data-parallel training wraps it (DDP over this
    instead of the bare model): the backbone, the head and the chunking run inside one
    DDP forward, and the gradients are averaged as before.
    """

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model
        #: :func:`head_matches` for this model, asked once: its class and logit settings
        #: do not change under a wrapper that lives as long as the trainer.
        self._head_matches: bool | None = None

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        loss_mask: torch.Tensor,
        targets: torch.Tensor,
        settings: SamplingSettings,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        trained = (loss_mask > 0).reshape(-1)
        index = trained.nonzero().squeeze(-1)
        empty = index.numel() == 0
        if empty:  # keep the graph (every parameter gets a zero gradient), add nothing
            index = torch.zeros(1, dtype=torch.long, device=input_ids.device)
        kwargs = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        if self._head_matches is None:
            self._head_matches = head_matches(self.model, input_ids)
        if self._head_matches:
            chosen, entropy = self._chunked(kwargs, index, targets.reshape(-1)[index], settings)
        else:
            chosen, entropy = self._plain(kwargs, index, targets.reshape(-1)[index], settings)
        if empty:
            chosen = chosen.masked_fill(torch.ones_like(chosen, dtype=torch.bool), 0.0)
            entropy = torch.zeros_like(entropy)
        return _scatter(chosen, index, loss_mask), _scatter(entropy, index, loss_mask)

    def _chunked(
        self,
        kwargs: dict[str, torch.Tensor],
        index: torch.Tensor,
        targets: torch.Tensor,
        settings: SamplingSettings,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        lm = causal_lm(self.model)
        hidden = backbone_hidden(lm, kwargs)
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, index)
        head = lm.get_output_embeddings()
        vocab = _vocab(head, lm.config)
        return chunk_logprobs(head, logit_transform(lm.config), rows, targets, settings, vocab)

    def _plain(
        self,
        kwargs: dict[str, torch.Tensor],
        index: torch.Tensor,
        targets: torch.Tensor,
        settings: SamplingSettings,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own forward: full logits of every position (the fallback)."""
        logits = self.model(**kwargs).logits
        rows = logits.reshape(-1, logits.shape[-1]).index_select(0, index)
        return token_logprobs(rows, targets, settings)


def backbone_hidden(lm: Any, kwargs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The last hidden states (after the final norm) from the model's backbone, without
    the head; no KV cache (a training forward never reads it)."""
    decoder = lm.get_decoder()
    if decoder is lm:
        raise TypeError(f"{type(lm).__name__}: get_decoder() found no separate backbone")
    return decoder(**kwargs, use_cache=False).last_hidden_state


def _scatter(values: torch.Tensor, index: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``values`` at the flat ``index`` of a zero tensor shaped as ``like`` (differentiable)."""
    # Not a view of a flat tensor: FSDP's root would have to warn about its output.
    out = torch.zeros(like.shape, dtype=values.dtype, device=values.device)
    return out.index_put(torch.unravel_index(index, like.shape), values)


def head_matches(model: Any, input_ids: torch.Tensor) -> bool:
    """Whether the chunked head gives the model's own logits (checked once per model
    class and logit-related config values, on a few tokens of ``input_ids``, in
    evaluation mode, with autocast off, or on to the half type of a model that mixes it
    with float32 weights); a mismatch is warned about once."""
    lm = causal_lm(model)
    key = _check_key(lm)
    if key not in _VERIFIED:
        _VERIFIED[key] = _verify(model, lm, input_ids[:1, :8])
    return _VERIFIED[key]


def _half_of(model: Any) -> torch.dtype | None:
    """The half type of a model that holds it beside float32 weights (a LoRA base with
    float32 adapters or ``modules_to_save``, a frozen copy's half linear layers): such a
    model only runs under autocast to it, as every forward of the run does."""
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    half = [d for d in (torch.bfloat16, torch.float16) if d in dtypes]
    return half[0] if half and torch.float32 in dtypes else None


def _verify(model: Any, lm: Any, ids: torch.Tensor) -> bool:
    name = type(lm).__name__
    was_training = model.training
    half = _half_of(model)
    model.eval()
    try:
        with torch.no_grad(), torch.autocast(ids.device.type, half, enabled=half is not None):
            expected = model(input_ids=ids).logits.float()
            kwargs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
            head = lm.get_output_embeddings()
            hidden = backbone_hidden(lm, kwargs)
            got = logit_transform(lm.config)(head(hidden)).float()
    except Exception as error:  # any failure means: use the plain path
        log.warning(
            "%s: the chunked logprob head does not run (%s); this model class computes "
            "full logits for training (more memory, same results)",
            name,
            error,
        )
        return False
    finally:
        model.train(was_training)
    dtype = half or next(iter(lm.parameters())).dtype
    tol = CHECK_ATOL if dtype == torch.float32 else 4 * torch.finfo(dtype).eps
    scale = float(expected.abs().max().clamp(min=1.0)) if dtype != torch.float32 else 1.0
    same = got.shape == expected.shape and bool(
        torch.allclose(got, expected, atol=tol * scale, rtol=tol)
    )
    if not same:
        log.warning(
            "%s: the chunked logprob head does not reproduce the model's logits (a logit "
            "post-processing this version does not know); this model class computes full "
            "logits for training (more memory, same results)",
            name,
        )
    return same
