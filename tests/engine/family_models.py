"""Tiny random-weight models of real families, saved to a folder and loaded as a user's.

Shared by the engine tests (imported by name: pytest puts this folder on ``sys.path``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from art_hydra import compose
from art_hydra.backends.layout import row_layout
from art_hydra.backends.tiny import build_tokenizer
from art_hydra.backends.torch_backend import LoadedModel, load

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
        loaded = LoadedModel(loaded.model, loaded.tokenizer, loaded.device, False, layout=layout)
    return cfg, loaded
