"""transformers + peft backend: any causal LM, LoRA or full fine-tuning, CPU or CUDA."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException

from art_hydra.backends.layout import row_layout
from art_hydra.config.schema import Device, DType, FinetuneMethod, ModelSource
from art_hydra.packing import Layout

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """What a backend hands the run: the trainable model, its tokenizer and device."""

    #: The policy (peft's LoRA tuner over the model, or the plain model for full tuning).
    model: Any
    #: The tokenizer (left padding).
    tokenizer: Any
    #: Where the model lives.
    device: Any
    #: True when the model carries LoRA adapters (the reference policy is then the base).
    is_peft: bool
    #: How training rows are laid out and prompts batched, chosen by the backend from the
    #: model's config (see :func:`art_hydra.backends.layout.row_layout`).
    layout: Layout
    #: Mixed precision: the training forward runs under autocast to this dtype, with
    #: loss scaling, over float32 weights (None: train in the weights' own dtype).
    autocast: Any = None

    def save_weights(self, folder: Path) -> None:
        """The trained weights as a standard folder (PEFT adapters, or a full model), and
        the tokenizer, all safetensors."""
        if self.is_peft:
            from art_hydra.backends.adapters import save_adapters

            save_adapters(self.model, folder)
        else:
            self.model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)

    def load_weights(self, folder: Path) -> None:
        """Load weights written by :meth:`save_weights` into this (same-shaped) model."""
        from safetensors.torch import load_file

        device = str(self.device)
        if self.is_peft:
            from art_hydra.backends.adapters import load_adapters

            weights = load_file(folder / "adapter_model.safetensors", device=device)
            unexpected = load_adapters(self.model, weights)
            if unexpected:
                raise RuntimeError(f"{folder} does not match the adapters: {unexpected[:5]}")
            return
        weights = {}
        for shard in sorted(folder.glob("*.safetensors")):
            weights.update(load_file(shard, device=device))
        missing, unexpected = self.model.load_state_dict(weights, strict=False)
        if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
            raise RuntimeError(
                f"{folder} does not match the model: missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}"
            )


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
    """The dtype the weights are loaded in: float16 trains mixed, on float32 masters."""
    import torch

    return {
        DType.auto: "auto",
        DType.float32: torch.float32,
        DType.bfloat16: torch.bfloat16,
        DType.float16: torch.float32,
    }[dtype]


def autocast_dtype(dtype: DType) -> Any:
    """The forward pass's autocast dtype (float16 mixed precision), or None."""
    import torch

    return torch.float16 if dtype == DType.float16 else None


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
    model, info = AutoModelForCausalLM.from_pretrained(
        model_cfg.name,
        revision=model_cfg.revision,
        trust_remote_code=model_cfg.trust_remote_code,
        dtype=torch_dtype(model_cfg.dtype),
        use_safetensors=True,  # never unpickle weights (a pickle can run any code)
        output_loading_info=True,
    )
    _refuse_missing_weights(model, info, str(model_cfg.name))
    settle_special_tokens(tokenizer, model, str(model_cfg.name))
    return model, tokenizer


class MissingWeightsError(CompactHydraException, ValueError):
    """The checkpoint lacks weights the architecture needs: transformers would start them
    at random and the run would fine-tune a partly random model without a word."""


def _refuse_missing_weights(model: Any, info: dict[str, Any], name: str) -> None:
    """Refuse a load that left weights at their random start (a truncated re-save, a
    shard from another revision). A head tied to the embeddings is not missing."""
    tied = set()
    if getattr(model.config, "tie_word_embeddings", False):
        tied = {n for n, _ in model.named_parameters() if n.endswith("lm_head.weight")}
    missing = sorted(set(info.get("missing_keys") or ()) - tied)
    if missing:
        shown = ", ".join(missing[:5]) + (
            f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        )
        raise MissingWeightsError(
            f"model.name={name}: the checkpoint has no weights for {len(missing)} tensor(s) "
            f"the architecture needs ({shown}); transformers would start them at random and "
            "the run would train a partly random model. Fix: point model.name at the complete "
            "folder save_pretrained wrote (or download it again: hf download <id>)."
        )


class MissingTokenError(CompactHydraException, ValueError):
    """The tokenizer has no EOS and none can be derived: completions could never end."""


def _first_id(value: Any) -> int | None:
    if isinstance(value, (list, tuple)) and value:
        value = value[0]
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def settle_special_tokens(tokenizer: Any, model: Any, name: str) -> None:
    """EOS and pad as the pre-flight derived them (:func:`art_hydra.folder_tokenizer.
    eos_token`): the tokenizer's own EOS, else the first ``eos_token_id`` of the
    generation config, then of the model config; pad is the tokenizer's, else EOS."""
    if tokenizer.eos_token is None:
        generation = getattr(model, "generation_config", None)
        config = getattr(model, "config", None)
        text = getattr(config, "get_text_config", lambda: config)()
        for source in (generation, config, text):
            token_id = _first_id(getattr(source, "eos_token_id", None))
            token = None if token_id is None else tokenizer.convert_ids_to_tokens(token_id)
            if token is not None:
                tokenizer.eos_token = token
                log.info("tokenizer has no eos_token: EOS is %r (eos_token_id=%d)", token, token_id)
                break
    if tokenizer.eos_token is None:
        raise MissingTokenError(
            f"model.name={name}: its tokenizer has no EOS token and its configs name no "
            'eos_token_id, so a completion could never end. Add "eos_token" to its '
            "tokenizer_config.json."
        )
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        log.info("tokenizer has no pad token: padding with EOS %r", tokenizer.eos_token)


def load(model_cfg: Any, backend_cfg: Any, seed: int, charset: str | None = None) -> LoadedModel:
    """Load ``cfg.model`` with transformers (+ peft) on ``cfg.backend.device``."""
    device = resolve_device(backend_cfg.device)
    model, tokenizer = load_base(model_cfg, seed, charset)
    if backend_cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    layout = row_layout(model.config, capacity=model_cfg.max_seq_length)
    log.info("row layout: %s", layout.reason)
    is_peft = model_cfg.finetune == FinetuneMethod.lora
    if is_peft:
        from art_hydra.backends.adapters import add_lora

        model = add_lora(model, model_cfg.lora, seed)
    model.to(device)
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        device=device,
        is_peft=is_peft,
        layout=layout,
        autocast=autocast_dtype(model_cfg.dtype),
    )
