"""Which row layout a model trains with, read from its own config.

Packing puts several sequences in one row behind a block-diagonal mask. transformers
(5.x) passes a 4D ``attention_mask`` to every attention layer as it is, so packing is
right only when (1) the attention implementation reads a 4D mask, in the form it
expects (sdpa: booleans; eager: an additive float, to which booleans would add +1/+0
and mask nothing); (2) no layer needs a different mask from the others (a sliding
window shorter than a row would be replaced by the block mask); and (3) no layer
carries state along the row (convolutions, recurrences and linear attention would run
from one packed sequence into the next). Anything else, and any family not proven by
``tests/engine/test_model_families.py``, trains one right-padded sequence per row with a
plain 2D padding mask, from which the model builds its own causal, sliding and
recurrent masks.

The sampler left-pads prompts of different lengths only for the same proven families;
others get batches of equal-length prompts, which need no padding at all.

(transformers 5.x can also infer packed sequences from position ids that restart at 0,
but only when no mask is passed at all, so padding then needs care; it is not used here.)
"""

from __future__ import annotations

from typing import Any

from art_hydra.engine.packing import Layout, MaskForm

#: Families whose packed rows, unpacked sequences and left-padded sampling are proven to
#: give the same logprobs (tests/engine/test_model_families.py covers each one).
PROVEN_FAMILIES = frozenset(
    {
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt_oss",
        "granite",
        "llama",
        "mistral",
        "mixtral",
        "olmo2",
        "phi3",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "smollm3",
    }
)
#: Attention implementations that read a 4D mask, and the form each honours. Flash
#: attention and its kin drop or reject a 4D mask; flex attention wants a BlockMask.
MASK_FORMS = {"sdpa": MaskForm.block_bool, "eager": MaskForm.block_additive}
#: Layer types that are attention alone (no state runs along the row).
ATTENTION_LAYERS = frozenset({"full_attention", "sliding_attention"})
#: Families with convolutional, recurrent or linear-attention layers, named in the reason
#: (they are not proven, so they would not pack anyway).
RECURRENT_FAMILIES = frozenset(
    {
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "granitemoehybrid",
        "jamba",
        "kimi_linear",
        "lfm2",
        "lfm2_moe",
        "mamba",
        "mamba2",
        "minimax",
        "nemotron_h",
        "olmo_hybrid",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "recurrent_gemma",
        "rwkv",
        "xlstm",
        "zamba",
        "zamba2",
    }
)


def _state_layers(config: Any) -> list[str]:
    """Layer types that carry state along the sequence (convolution, recurrence, ...)."""
    types = getattr(config, "layer_types", None) or []
    return sorted({t for t in types if t not in ATTENTION_LAYERS})


def _binding_window(config: Any, capacity: int | None) -> int | None:
    """The sliding window when some layer uses one shorter than a row, else None.

    A layer attends to keys fewer than ``window`` positions back, so in a row of at most
    ``capacity`` tokens a window of ``capacity`` or more never binds, and the block mask
    that replaces it changes nothing. An unknown capacity binds every window.
    """
    window = getattr(config, "sliding_window", None)
    if window is None:
        return None
    types = getattr(config, "layer_types", None)
    # Without layer_types (Mistral, Phi-3) a set window applies to every layer.
    sliding = types is None or "sliding_attention" in types
    binds = capacity is None or window < capacity
    return int(window) if sliding and binds else None


def left_pads(config: Any) -> bool:
    """Whether the sampler may left-pad this model's prompts (proven attention-only
    families; a recurrence or convolution would run through the padding)."""
    return getattr(config, "model_type", None) in PROVEN_FAMILIES and not _state_layers(config)


def _one_per_row(config: Any, why: str) -> Layout:
    reason = f"one sequence per row, right-padded (no packing), because {why}"
    return Layout(MaskForm.padding, left_padding=left_pads(config), reason=reason)


def row_layout(config: Any, capacity: int | None) -> Layout:
    """The layout for a model with this ``config`` (``model.config``), for rows of at most
    ``capacity`` tokens (``model.max_seq_length``; None when unknown)."""
    family = getattr(config, "model_type", None)
    impl = getattr(config, "_attn_implementation", None)
    state = _state_layers(config)
    if state or family in RECURRENT_FAMILIES:
        layers = ", ".join(state) if state else "recurrent"
        return _one_per_row(
            config, f"{family} has {layers} layers that would carry state between sequences"
        )
    if family not in PROVEN_FAMILIES:
        return _one_per_row(config, f"packing is not proven for the {family!r} family")
    if not getattr(config, "is_causal", True) or getattr(
        config, "use_bidirectional_attention", False
    ):
        return _one_per_row(config, f"{family} is configured with bidirectional attention")
    if impl not in MASK_FORMS:
        return _one_per_row(
            config, f"attention implementation {impl!r} does not honour a 4D block mask"
        )
    window = _binding_window(config, capacity)
    if window is not None:
        return _one_per_row(
            config,
            f"a sliding window of {window} tokens is shorter than a row of "
            f"{capacity or 'unknown length'} (model.max_seq_length); a block mask would "
            "replace it",
        )
    form = MASK_FORMS[impl]
    kind = "boolean" if form == MaskForm.block_bool else "additive float"
    reason = (
        f"packed: several sequences share each row, kept apart by a block-diagonal {kind} "
        f"mask, because packing is proven for the {family} family and its attention "
        f"implementation ({impl}) honours such a mask"
    )
    return Layout(form, left_padding=True, reason=reason)


def unpacked_layout(config: Any, why: str) -> Layout:
    """One sequence per row whatever the family (for kernels that drop the mask)."""
    return _one_per_row(config, why)
