"""Tiny random-weight models of real families, saved to a folder and loaded as a user's.

Shared by the engine tests (imported by name: pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch

from art_hydra import compose
from art_hydra.backends.layout import row_layout
from art_hydra.backends.tiny import build_tokenizer
from art_hydra.backends.torch_backend import LoadedModel, load
from art_hydra.packing import MaskForm

#: model.max_seq_length of every family model here: the packing capacity.
CAPACITY = 64
#: Large enough weights that a wrong mask moves logprobs far beyond fp32 tolerance.
INIT_STD = 0.3


def save_family(folder: Path, model_type: str, extra: dict[str, Any]) -> Path:
    """A ``from_pretrained``-loadable folder: config, random weights, the char tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = build_tokenizer()
    config = AutoConfig.for_model(
        model_type,
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        initializer_range=INIT_STD,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **extra,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():  # biases start at zero; a trained model's are not
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0, INIT_STD)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
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
}
