"""LoRA adapters: added through peft's tuner, saved and read in PEFT's own folder format.

The torch backend adds adapters with peft's ``LoraModel`` (the tuner that ``PeftModel``
wraps), not ``get_peft_model``: ``PeftModel.__init__`` reads transformers' deprecated
``is_gradient_checkpointing`` and prints a FutureWarning in every LoRA run. The folder
written is the one ``PeftModel.save_pretrained`` writes (``adapter_model.safetensors``
with ``base_model.model.*`` keys, ``adapter_config.json``), so checkpoints still load
with ``peft.PeftModel.from_pretrained``. The Unsloth backend hands over a ``PeftModel``;
every function here accepts both.

Before adapters are added, the configured target and trained module names are matched
against the model's own modules the way peft matches them, and a name that matches
nothing is reported with the names the model does have (peft would raise a traceback
after loading, or silently pick its defaults for an empty list).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from art_hydra.config.problems import ConfigValidationError, Kind, Problem, fix

#: The adapter's name inside peft (its default).
ADAPTER = "default"
#: The key prefix PeftModel adds in front of the tuner's own state-dict keys.
PEFT_PREFIX = "base_model."


def tuner(model: Any) -> Any:
    """The ``LoraModel`` of a LoRA policy (a ``PeftModel``'s ``base_model``, or itself)."""
    from peft import PeftModel

    return model.base_model if isinstance(model, PeftModel) else model


def _matches(module_name: str, target: str) -> bool:
    return module_name == target or module_name.endswith(f".{target}")


def unmatched_names(model: Any, lora_cfg: Any) -> list[Problem]:
    """Target and trained module names that match no module of ``model`` (run moment)."""
    import torch

    names = [name for name, _ in model.named_modules() if name]
    linear = sorted(
        {
            name.rpartition(".")[2]
            for name, module in model.named_modules()
            if isinstance(module, torch.nn.Linear)
        }
    )
    problems = []
    for key in ("target_modules", "modules_to_save"):
        wanted = list(lora_cfg[key])
        missing = [t for t in wanted if not any(_matches(n, t) for n in names)]
        if missing:
            kept = [t for t in wanted if t not in missing]
            problems.append(
                Problem(
                    f"model.lora.{key}",
                    wanted,
                    f"{', '.join(missing)} match{'es' if len(missing) == 1 else ''} no module "
                    f"of {type(model).__name__}; its linear layers are named "
                    f"{', '.join(linear)}.",
                    fix({f"model.lora.{key}": kept or linear}),
                    Kind.run,
                )
            )
    return problems


def add_lora(model: Any, lora_cfg: Any, seed: int) -> Any:
    """``model`` with LoRA adapters (deterministic per seed), as peft's ``LoraModel``."""
    import torch
    from peft import LoraConfig, LoraModel

    problems = unmatched_names(model, lora_cfg)
    if problems:
        raise ConfigValidationError(
            problems, footer="The model was loaded; nothing was trained or written."
        )
    config = LoraConfig(
        r=lora_cfg.r,
        lora_alpha=lora_cfg.alpha,
        lora_dropout=lora_cfg.dropout,
        target_modules=list(lora_cfg.target_modules),
        modules_to_save=list(lora_cfg.modules_to_save) or None,
        task_type="CAUSAL_LM",
        base_model_name_or_path=getattr(model.config, "_name_or_path", None) or None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        tuned = LoraModel(model, config, ADAPTER)
    for name, param in tuned.named_parameters():
        # Adapters train in float32 over a half-precision base, as PeftModel casts them.
        if "lora_" in name and param.dtype in (torch.float16, torch.bfloat16):
            param.data = param.data.float()
    if getattr(model, "is_activation_checkpointing", False):
        model.enable_input_require_grads()  # checkpointed blocks need a grad-carrying input
    return tuned


@contextlib.contextmanager
def adapters_disabled(model: Any) -> Iterator[None]:
    """The base model under the adapters (the reference policy of a LoRA run)."""
    lora = tuner(model)
    lora.disable_adapter_layers()
    try:
        yield
    finally:
        lora.enable_adapter_layers()


def save_adapters(model: Any, folder: Path) -> None:
    """Write the adapters as ``PeftModel.save_pretrained`` would (safetensors + config)."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    lora = tuner(model)
    state = get_peft_model_state_dict(lora, adapter_name=ADAPTER)
    tensors = {f"{PEFT_PREFIX}{k}": v.detach().contiguous().cpu() for k, v in state.items()}
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors", metadata={"format": "pt"})
    lora.peft_config[ADAPTER].save_pretrained(str(folder))


def load_adapters(model: Any, weights: dict[str, Any]) -> list[str]:
    """Set adapter weights read from ``adapter_model.safetensors``; the unexpected keys."""
    from peft import set_peft_model_state_dict

    state = {k.removeprefix(PEFT_PREFIX): v for k, v in weights.items()}
    outcome = set_peft_model_state_dict(tuner(model), state, adapter_name=ADAPTER)
    return list(getattr(outcome, "unexpected_keys", []) or [])
