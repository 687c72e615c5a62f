"""transformers + peft backend: any causal LM, LoRA or full fine-tuning, CPU or CUDA."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from art_hydra.config.schema import Device, DType, FinetuneMethod, ModelSource


@dataclass
class LoadedModel:
    """What a backend hands the run: the trainable model, its tokenizer and device."""

    #: The policy (a peft ``PeftModel`` for LoRA, the plain model for full fine-tuning).
    model: Any
    #: The tokenizer (left padding).
    tokenizer: Any
    #: Where the model lives.
    device: Any
    #: True when the model carries LoRA adapters (the reference policy is then the base).
    is_peft: bool
    #: Whether several sequences may share a row (the model honours a 4D attention mask).
    packs: bool = True


def resolve_device(device: Device) -> Any:
    import torch

    if device == Device.auto:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == Device.cuda and not torch.cuda.is_available():
        raise RuntimeError(
            "backend.device=cuda but torch sees no CUDA GPU; use backend.device=auto or cpu"
        )
    return torch.device(device.value)


def torch_dtype(dtype: DType) -> Any:
    import torch

    return {
        DType.auto: "auto",
        DType.float32: torch.float32,
        DType.bfloat16: torch.bfloat16,
        DType.float16: torch.float16,
    }[dtype]


def load_base(model_cfg: Any, seed: int, charset: str | None = None) -> tuple[Any, Any]:
    """The base model and tokenizer, before any adapter."""
    if model_cfg.source == ModelSource.tiny:
        from art_hydra.backends.tiny import build_model, build_tokenizer

        tokenizer = build_tokenizer(charset)
        model = build_model(model_cfg, tokenizer, seed)
        if model_cfg.dtype != DType.auto:
            model = model.to(torch_dtype(model_cfg.dtype))
        return model, tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(
        model_cfg.name, revision=model_cfg.revision, trust_remote_code=model_cfg.trust_remote_code
    )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(
        model_cfg.name,
        revision=model_cfg.revision,
        trust_remote_code=model_cfg.trust_remote_code,
        dtype=torch_dtype(model_cfg.dtype),
    )
    return model, tokenizer


def add_adapters(model: Any, lora_cfg: Any, seed: int) -> Any:
    """Wrap ``model`` with LoRA adapters as configured (deterministic per seed)."""
    import torch
    from peft import LoraConfig as PeftLoraConfig
    from peft import get_peft_model

    config = PeftLoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules) or None,
        modules_to_save=list(lora_cfg.modules_to_save) or None,
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def load(model_cfg: Any, backend_cfg: Any, seed: int, charset: str | None = None) -> LoadedModel:
    """Load ``cfg.model`` with transformers (+ peft) on ``cfg.backend.device``."""
    device = resolve_device(backend_cfg.device)
    model, tokenizer = load_base(model_cfg, seed, charset)
    if backend_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    is_peft = model_cfg.finetune == FinetuneMethod.lora
    if is_peft:
        model = add_adapters(model, model_cfg.lora, seed)
    model.to(device)
    return LoadedModel(model=model, tokenizer=tokenizer, device=device, is_peft=is_peft)
