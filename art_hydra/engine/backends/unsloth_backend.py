"""Unsloth backend: fused kernels and 4-bit (QLoRA) loading on a CUDA GPU.

The only module that imports unsloth; :func:`art_hydra.engine.backends.prepare` imports it
before anything touches transformers, as Unsloth requires for its patches to apply.
Without a GPU, Unsloth falls back to a CPU path (plain transformers + peft behind its
API), which the CI stage uses to run this backend for real.
"""

from __future__ import annotations

import tempfile
from typing import TYPE_CHECKING, Any

from art_hydra.config.problems import ConfigValidationError
from art_hydra.config.schema import DType, FinetuneMethod, ModelSource
from art_hydra.engine.backends.adapters import peft_lora_settings, unmatched_names
from art_hydra.engine.backends.layout import unpacked_layout
from art_hydra.engine.backends.torch_backend import LoadedModel, resolve_device, torch_dtype

if TYPE_CHECKING:
    from art_hydra.config.schema import BackendConfig, ModelConfig


def load(
    model_cfg: ModelConfig, backend_cfg: BackendConfig, seed: int, charset: str | None = None
) -> LoadedModel:
    """Load ``cfg.model`` through ``FastLanguageModel`` (the tiny model via a temp folder)."""
    import unsloth  # noqa: F401  (must precede transformers)
    from unsloth import FastLanguageModel

    device = resolve_device(backend_cfg.device)
    name = model_cfg.name
    keep_alive = None
    if model_cfg.source == ModelSource.tiny:
        from art_hydra.engine.backends.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer(charset)
        keep_alive = tempfile.TemporaryDirectory(prefix="art_hydra_tiny_")
        build_model(model_cfg, tokenizer, seed).save_pretrained(keep_alive.name)
        tokenizer.save_pretrained(keep_alive.name)
        name = keep_alive.name
    checkpointing = "unsloth" if backend_cfg.gradient_checkpointing else False
    model, tokenizer = FastLanguageModel.from_pretrained(
        model_name=name,
        max_seq_length=model_cfg.max_seq_length,
        dtype=_unsloth_dtype(model_cfg.dtype),
        load_in_4bit=model_cfg.load_in_4bit,
        full_finetuning=model_cfg.finetune == FinetuneMethod.full,
        use_gradient_checkpointing=checkpointing,
    )
    tokenizer.padding_side = "left"
    # EOS and pad derived as the pre-flight said, the same way as the torch backend.
    from art_hydra.engine.backends.torch_backend import settle_special_tokens

    settle_special_tokens(tokenizer, model, str(model_cfg.name))
    is_peft = model_cfg.finetune == FinetuneMethod.lora
    if is_peft:
        lora = model_cfg.lora
        problems = unmatched_names(model, lora)
        if problems:
            raise ConfigValidationError(
                problems, footer="The model was loaded; nothing was trained or written."
            )
        model = FastLanguageModel.get_peft_model(
            model,
            **peft_lora_settings(lora),
            use_gradient_checkpointing=checkpointing,
            random_state=seed,
        )
    if keep_alive is not None:
        keep_alive.cleanup()
    # Unsloth's fast Llama forward drops the attention mask in training, so packed
    # sequences would attend to each other: one sequence per row instead.
    layout = unpacked_layout(model.config, "Unsloth's fast kernels drop the attention mask")
    return LoadedModel(
        model=model, tokenizer=tokenizer, device=device, is_peft=is_peft, layout=layout
    )


def _unsloth_dtype(dtype: DType) -> Any:
    """Unsloth picks its own precision for ``auto`` and manages float16 itself."""
    import torch

    if dtype == DType.auto:
        return None
    return torch.float16 if dtype == DType.float16 else torch_dtype(dtype)
