"""Tiny random-weight models of real families, saved to a folder and loaded as a user's.

Shared by the engine tests (imported by name: pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

import torch
from family_matrix import describe, sample

from art_hydra import compose
from art_hydra.engine.backends.layout import row_layout
from art_hydra.engine.backends.tiny import build_tokenizer
from art_hydra.engine.backends.torch_backend import LoadedModel, load
from art_hydra.engine.packing import MaskForm

#: model.max_seq_length of every family model here: the packing capacity.
CAPACITY = 64
#: Large enough weights that a wrong mask moves logprobs far beyond fp32 tolerance.
INIT_STD = 0.3


def build_family(model_type: str, extra: dict[str, Any]) -> Any:
    """The family's tiny random-weight model (seed 0), the char tokenizer's vocabulary;
    ``extra`` (a family's own config) overrides the common sizes."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_tokenizer()
    sizes = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "initializer_range": INIT_STD,
        "pad_token_id": tokenizer.pad_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
    }
    config = AutoConfig.for_model(model_type, **{**sizes, **extra})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # biases start at zero; a trained model's are not
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, config.initializer_range)
    return model


def save_family(folder: Path, model_type: str, extra: dict[str, Any]) -> Path:
    """A ``from_pretrained``-loadable folder: config, random weights, the char tokenizer."""
    build_family(model_type, extra).save_pretrained(folder)
    build_tokenizer().save_pretrained(folder)
    return folder


def load_family(
    folder: Path, attn_implementation: str | None = None, overrides: list[str] | None = None
) -> tuple[Any, LoadedModel]:
    """(cfg, loaded model) through the torch backend, as ``model.source=pretrained``.

    ``attn_implementation`` switches the attention after loading (transformers keeps no
    such choice in ``config.json``), and the layout is chosen again for it.
    """
    cfg = compose(
        [
            f"model.name={folder}",
            "model.source=pretrained",
            "model.finetune=full",
            f"model.max_seq_length={CAPACITY}",
            "backend.device=cpu",
            *(overrides or []),
        ]
    )
    loaded = load(cfg.model, cfg.backend, seed=0)
    if attn_implementation is not None:
        loaded.model.set_attn_implementation(attn_implementation)
        layout = row_layout(loaded.model.config, CAPACITY)
        loaded = dataclasses.replace(loaded, layout=layout)
    return cfg, loaded


PACKED, ADDITIVE, PADDED = MaskForm.block_bool, MaskForm.block_additive, MaskForm.padding
MIXED = ["sliding_attention", "full_attention"]
MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32}
GPT_OSS = {"num_local_experts": 4, "num_experts_per_tok": 2}

HYBRID = ["linear_attention", "full_attention"]
#: Linear-attention (gated delta net) heads of the Qwen3-Next kin, small.
LINEAR = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 16,
}
#: Mamba-2 mixers of the hybrids: 8 heads of 16 (hidden 64 x expand 2), small state.
SSM = {"mamba_n_heads": 8, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_chunk_size": 16}

#: Hybrid and state-space families: id -> (model_type, extra config). Each carries
#: convolution or recurrent state along the row, so each trains one sequence per row
#: and samples prompts batched by length (no padding for the state to run through);
#: the cache copy for shared prompts covers their conv/SSM/recurrent states
#: (tests/engine/test_hybrid_caches.py). Two layers, one of each kind, where a family
#: mixes attention and state.
HYBRIDS: dict[str, tuple[str, dict[str, Any]]] = {
    "falcon_h1": ("falcon_h1", {**SSM, "mamba_d_ssm": 128}),
    "bamba": ("bamba", {**SSM, "attn_layer_indices": [1]}),
    "granitemoehybrid": (
        "granitemoehybrid",
        {**SSM, "layer_types": HYBRID, "num_local_experts": 4, "shared_intermediate_size": 32},
    ),
    "jamba": (
        "jamba",
        {
            "attn_layer_period": 2,
            "attn_layer_offset": 1,
            "expert_layer_period": 2,
            "expert_layer_offset": 1,
            "num_experts": 4,
            "mamba_d_state": 8,
            "mamba_dt_rank": 8,
        },
    ),
    "nemotron_h": (
        "nemotron_h",
        {
            "layers_block_type": ["linear_attention", "full_attention", "moe"],
            "n_routed_experts": 4,
            "moe_intermediate_size": 32,
            "moe_shared_expert_intermediate_size": 32,
            "mamba_num_heads": 8,
            "mamba_head_dim": 16,
            "ssm_state_size": 16,
            "n_groups": 1,
            "chunk_size": 16,
        },
    ),
    "qwen3_next": (
        "qwen3_next",
        {**LINEAR, **MOE, "layer_types": HYBRID, "shared_expert_intermediate_size": 32},
    ),
    "qwen3_5_text": ("qwen3_5_text", {**LINEAR, "layer_types": HYBRID}),
    "qwen3_5_moe_text": (
        "qwen3_5_moe_text",
        {**LINEAR, **MOE, "layer_types": HYBRID, "shared_expert_intermediate_size": 32},
    ),
    "olmo_hybrid": ("olmo_hybrid", {**LINEAR, "layer_types": HYBRID}),
    "kimi_linear": (
        "kimi_linear",
        {
            "layer_types": HYBRID,
            "mlp_layer_types": ["dense", "dense"],
            "linear_num_heads": 4,
            "linear_head_dim": 16,
            "num_experts": 4,
            "qk_rope_head_dim": 8,
            "qk_nope_head_dim": 8,
            "v_head_dim": 16,
            "num_key_value_heads": 4,  # its latent attention has a key/value head per head
        },
    ),
    # Zamba ties the shared attention block of its hybrid layers: it needs two of them.
    # At std 0.3 a right-padded row is 2e-4 off the sequence alone (float32 rounding
    # amplified by its large random Mamba weights); 0.1 keeps every path within 1e-5.
    "zamba": (
        "zamba",
        {
            "num_hidden_layers": 3,
            "layers_block_type": ["hybrid", "mamba", "hybrid"],
            "attention_head_dim": 32,
            "n_mamba_heads": 2,
            "mamba_d_state": 8,
            "mamba_dt_rank": 8,
            "initializer_range": 0.1,
        },
    ),
    # At the matrix's std 0.3 its cached decoding drifts from the full forward in float32
    # (1e-3..6e-2 by the 8th token, shrinking smoothly with the std: conditioning, not a
    # wrong cache); at 0.1 it stays within 4e-5.
    "zamba2": (
        "zamba2",
        {
            "layers_block_type": ["mamba", "hybrid"],
            "n_mamba_heads": 8,
            "mamba_d_state": 16,
            "chunk_size": 16,
            "initializer_range": 0.1,
        },
    ),
    "mamba": ("mamba", {"state_size": 8}),
    "mamba2": (
        "mamba2",
        {"num_heads": 8, "head_dim": 16, "state_size": 16, "n_groups": 1, "chunk_size": 16},
    ),
    "falcon_mamba": ("falcon_mamba", {"state_size": 8}),
    "lfm2_moe": (
        "lfm2_moe",
        {**MOE, "layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    ),
    "minimax": ("minimax", {"num_local_experts": 4, "block_size": 16}),
}

#: id -> (model_type, extra config, the mask form its layout must use, left-pads prompts)
FAMILIES: dict[str, tuple[str, dict[str, Any], MaskForm, bool]] = {
    "llama": ("llama", {}, PACKED, True),
    # transformers keeps no choice of attention in config.json (Gemma-2 defaults to eager):
    # this one is switched after loading, as model.set_attn_implementation does for a user.
    "llama-eager": ("llama", {}, ADDITIVE, True),
    "qwen2": ("qwen2", {}, PACKED, True),
    "qwen3": ("qwen3", {}, PACKED, True),
    "phi3": ("phi3", {}, PACKED, True),
    "gemma2-eager": ("gemma2", {"attn_implementation": "eager"}, ADDITIVE, True),
    "mistral-window4": ("mistral", {"sliding_window": 4}, PADDED, True),
    "mistral-window64": ("mistral", {"sliding_window": CAPACITY}, PACKED, True),
    "gemma3_text-window4": (
        "gemma3_text",
        {"sliding_window": 4, "layer_types": MIXED},
        PADDED,
        True,
    ),
    "gemma3_text-window64": (
        "gemma3_text",
        {"sliding_window": CAPACITY, "layer_types": MIXED},
        PACKED,
        True,
    ),
    "gemma": ("gemma", {}, PACKED, True),
    "granite": ("granite", {}, PACKED, True),
    "olmo2": ("olmo2", {}, PACKED, True),
    "smollm3": ("smollm3", {}, PACKED, True),
    "mixtral": ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}, PACKED, True),
    "qwen2_moe": ("qwen2_moe", {**MOE, "shared_expert_intermediate_size": 32}, PACKED, True),
    "qwen3_moe": ("qwen3_moe", MOE, PACKED, True),
    # gpt-oss defaults to eager attention (it adds attention sinks) and alternates
    # sliding (128) and full layers.
    "gpt_oss-eager": ("gpt_oss", GPT_OSS, ADDITIVE, True),
    "gpt_oss-eager-window4": ("gpt_oss", {**GPT_OSS, "sliding_window": 4}, PADDED, True),
    # Its convolution has biases: left padding would leak into the conv state (measured:
    # 7e-2 off), so its prompts are batched by length.
    "lfm2-conv": (
        "lfm2",
        {"layer_types": ["conv", "full_attention"], "conv_bias": True},
        PADDED,
        False,
    ),
    **{name: (model_type, extra, PADDED, False) for name, (model_type, extra) in HYBRIDS.items()},
}


#: The hybrids the model tier runs (one Mamba-2 + attention hybrid, one gated delta net
#: + attention hybrid, one pure state-space model); the others run in the slow tier.
QUICK_HYBRIDS = frozenset({"falcon_h1", "qwen3_next", "mamba"})
_WINDOWS = {"mistral-window4", "gemma3_text-window4", "gpt_oss-eager-window4"}
_MOE_HYBRIDS = {"granitemoehybrid", "jamba", "nemotron_h", "qwen3_next", "qwen3_5_moe_text"}
_MOE_HYBRIDS |= {"kimi_linear", "lfm2_moe", "minimax"}
#: Behaviour class -> the families that have it: each run trains one of each
#: (tests/family_matrix.py). A new family joins the classes its behaviour puts it in.
CLASSES: dict[str, set[str]] = {
    "packed rows, boolean block mask": {n for n, f in FAMILIES.items() if f[2] == PACKED},
    "packed rows, additive block mask (eager)": {
        n for n, f in FAMILIES.items() if f[2] == ADDITIVE
    },
    "attention switched after loading": {"llama-eager"},
    "a window that binds: one sequence per row": _WINDOWS,
    "a window covering the row: packs": {"mistral-window64", "gemma3_text-window64"},
    "sliding and full layers mixed": {n for n in FAMILIES if n.startswith(("gemma3", "gpt"))},
    "attention sinks": {"gpt_oss-eager", "gpt_oss-eager-window4"},
    "soft-capped logits": {"gemma2-eager"},
    "tied head": {"gemma", "gemma2-eager", "gemma3_text-window4", "gemma3_text-window64"}
    | {"smollm3", "mamba", "falcon_mamba", "zamba"},
    "experts": {"mixtral", "qwen2_moe", "qwen3_moe", "gpt_oss-eager"} | _MOE_HYBRIDS,
    "short convolution (batched by length)": {"lfm2-conv", "lfm2_moe"},
    "Mamba-2 + attention hybrid": {"falcon_h1", "bamba", "granitemoehybrid", "nemotron_h"}
    | {"zamba2"},
    "Mamba-1 + attention hybrid": {"jamba", "zamba"},
    "gated delta net + attention hybrid": {"qwen3_next", "qwen3_5_text", "qwen3_5_moe_text"}
    | {"olmo_hybrid", "kimi_linear"},
    "pure state-space": {"mamba", "mamba2", "falcon_mamba"},
    "lightning attention": {"minimax"},
}
#: The families this run trains: every class's representative (all of them under
#: ``ART_HYDRA_FULL_MATRIX=1``).
MATRIX = sample(CLASSES, FAMILIES)


def family_params(names: Any) -> list[Any]:
    """The families of ``names`` this run trains (:data:`MATRIX`, plus a member of any
    class ``names`` holds that MATRIX does not cover there), as pytest params; the
    hybrids outside QUICK_HYBRIDS marked slow (each builds and runs a model of its own;
    together they would double the model tier)."""
    import pytest

    return [
        pytest.param(name, marks=pytest.mark.slow)
        if name in HYBRIDS and name not in QUICK_HYBRIDS
        else name
        for name in sample(CLASSES, names, MATRIX, extra=0)
    ]


_SAVED: dict[str, Path] = {}


def family_folder(name: str, tmp_path_factory: Any) -> Path:
    """FAMILIES[name] saved once per session (per xdist worker): the modules that load
    a family read the same folder (loading never writes to it)."""
    if name not in _SAVED:
        model_type, extra, _, _ = FAMILIES[name]
        _SAVED[name] = save_family(tmp_path_factory.mktemp(name), model_type, extra)
    return _SAVED[name]


if __name__ == "__main__":  # the Makefile's line before the tiers that train
    sys.stdout.write(describe(MATRIX, FAMILIES) + "\n")
