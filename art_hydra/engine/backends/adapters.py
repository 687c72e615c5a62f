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
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_hydra.config.problems import ConfigValidationError, Kind, Problem, fix

if TYPE_CHECKING:
    from art_hydra.config.schema import LoraConfig

#: The adapter's name inside peft (its default).
ADAPTER = "default"
#: The key prefix PeftModel adds in front of the tuner's own state-dict keys.
PEFT_PREFIX = "base_model."


def tuner(model: Any) -> Any:
    """The ``LoraModel`` of a LoRA policy (a ``PeftModel``'s ``base_model``, or itself)."""
    from peft import PeftModel

    return model.base_model if isinstance(model, PeftModel) else model


def _matches(module_name: str, target: str) -> bool:
    """peft's rule for a list of names: the module's full name, or its last dotted part(s)."""
    return module_name == target or module_name.endswith(f".{target}")


def _wrappable() -> tuple[type, ...]:
    """The module types peft's LoRA can wrap (its own list, in its own error message)."""
    import torch

    kinds: list[type] = [
        torch.nn.Linear,
        torch.nn.Embedding,
        torch.nn.Conv1d,
        torch.nn.Conv2d,
        torch.nn.Conv3d,
        torch.nn.MultiheadAttention,
    ]
    try:
        from transformers.pytorch_utils import Conv1D

        kinds.append(Conv1D)
    except ImportError:  # an older transformers: peft does not know it either
        pass
    return tuple(kinds)


@dataclass(frozen=True)
class ModuleTree:
    """What the LoRA name rules need of a model: each module's name and whether LoRA can
    wrap it, and the names of the decoder's linear layers (the fix). The run reads it
    from the loaded model (:func:`module_tree`); the pre-flight from the safetensors
    header (:func:`art_hydra.model_files.module_tree`), so that both judge alike."""

    #: The model, as the reasons name it (its class, ``LlamaForCausalLM``).
    label: str
    #: Every named module -> "" where peft can wrap it (a layer), else what it is
    #: (``LlamaMLP``, "a block"): a module LoRA cannot wrap, named so in the reason.
    modules: dict[str, str]
    #: The last names of the decoder's linear layers, without the output head.
    linear: list[str]
    #: The modules that hold weights (of their own or inside them); None: all of them.
    #: One without (an activation, a rotary table) trains nothing in modules_to_save.
    weighted: frozenset[str] | None = None


def module_tree(model: Any) -> ModuleTree:
    """The loaded model's modules, as the LoRA name rules read them."""
    kinds = _wrappable()
    return ModuleTree(
        type(model).__name__,
        {
            name: "" if isinstance(m, kinds) else type(m).__name__
            for name, m in model.named_modules()
            if name
        },
        _layer_names(model),
        frozenset(n for n, m in model.named_modules() if n and any(True for _ in m.parameters())),
    )


def unmatched_names(model: Any, lora_cfg: LoraConfig) -> list[Problem]:
    """What peft would refuse with a traceback, or do silently, as a report (run moment,
    before peft is called): :func:`lora_name_problems` on the loaded model."""
    return lora_name_problems(module_tree(model), lora_cfg, Kind.run)


def lora_name_problems(tree: ModuleTree, lora_cfg: LoraConfig, kind: Kind) -> list[Problem]:
    """Target and trained module names that match no module of the model; targets that
    match modules LoRA cannot wrap (a block such as ``mlp`` or ``self_attn``: its linear
    layers are what to name); and a module both targeted and trained in full
    (``modules_to_save``), which peft would wrap twice. ``kind``: which moment found them
    (the run, after loading; the world pre-flight, from the folder's files)."""
    linear = tree.linear
    problems = _unwrappable(tree, lora_cfg, kind) + _both_ways(tree, lora_cfg, kind)
    for key in ("target_modules", "modules_to_save"):
        wanted = [str(t) for t in getattr(lora_cfg, key)]
        names = tree.modules
        if key == "modules_to_save" and tree.weighted is not None:
            names = {n: w for n, w in names.items() if n in tree.weighted}
        missing = [t for t in wanted if not any(_matches(n, t) for n in names)]
        if missing:
            kept = [t for t in wanted if t not in missing]
            shorthand = (
                " (all-linear is peft's shorthand for a single string; here the list names "
                "the layers)"
                if "all-linear" in missing
                else ""
            )
            problems.append(
                Problem(
                    f"model.lora.{key}",
                    wanted,
                    f"{', '.join(missing)} match{'es' if len(missing) == 1 else ''} no module "
                    f"{'with weights ' if key == 'modules_to_save' else ''}"
                    f"of {tree.label}; its decoder's linear layers are named "
                    f"{', '.join(linear)}{shorthand}.",
                    # The user's names that exist; none: every decoder layer (never the head).
                    fix({f"model.lora.{key}": kept or (linear if key == "target_modules" else [])}),
                    kind,
                )
            )
    return problems


def _layer_names(model: Any) -> list[str]:
    """The names of the decoder's linear layers LoRA is meant for: ``nn.Linear`` and
    transformers' ``Conv1D`` (GPT-2's c_attn/c_proj/c_fc), without the output head."""
    import torch

    kinds: tuple[type, ...] = (torch.nn.Linear,)
    try:
        from transformers.pytorch_utils import Conv1D

        kinds = (torch.nn.Linear, Conv1D)
    except ImportError:
        pass
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return sorted(
        {
            name.rpartition(".")[2]
            for name, module in model.named_modules()
            if isinstance(module, kinds) and module is not head
        }
    )


def _unwrappable(tree: ModuleTree, lora_cfg: LoraConfig, kind: Kind) -> list[Problem]:
    """``target_modules`` entries whose matches LoRA cannot wrap (peft raises on the first
    such module), with the wrappable layers inside them as the fix."""
    wanted = [str(t) for t in lora_cfg.target_modules]
    bad: list[str] = []
    shown: list[str] = []
    inside: list[str] = []
    for target in wanted:
        refused = [n for n, what in tree.modules.items() if _matches(n, target) and what]
        if not refused:
            continue
        bad.append(target)
        shown.append(f"{target} ({tree.modules[refused[0]]})")
        for name in refused:
            inside += [
                n.rpartition(".")[2]
                for n, what in tree.modules.items()
                if n.startswith(f"{name}.") and not what
            ]
    if not bad:
        return []
    kept = [t for t in wanted if t not in bad]
    replacement = list(dict.fromkeys([*kept, *sorted(set(inside))])) or tree.linear
    return [
        Problem(
            "model.lora.target_modules",
            wanted,
            f"{', '.join(shown)} {'is' if len(bad) == 1 else 'are'} not a layer of "
            f"{tree.label} that LoRA can wrap (peft wraps Linear, Embedding, Conv and "
            "MultiheadAttention layers): a block, whose layers are what to name, or a norm.",
            fix({"model.lora.target_modules": replacement}),
            kind,
        )
    ]


def _both_ways(tree: ModuleTree, lora_cfg: LoraConfig, kind: Kind) -> list[Problem]:
    """Modules matched by both ``target_modules`` and ``modules_to_save``."""
    targets = [str(t) for t in lora_cfg.target_modules]
    saved = [str(t) for t in lora_cfg.modules_to_save]
    both = sorted(
        {
            target
            for name in tree.modules
            for target in targets
            if _matches(name, target) and any(_matches(name, s) for s in saved)
        }
    )
    if not both:
        return []
    return [
        Problem(
            "model.lora.target_modules",
            targets,
            f"{', '.join(both)} {'is' if len(both) == 1 else 'are'} also in "
            f"model.lora.modules_to_save={saved}: a module is either trained in full "
            "(modules_to_save) or through LoRA adapters (target_modules), not both.",
            fix({"model.lora.target_modules": [t for t in targets if t not in both]}),
            kind,
        )
    ]


def peft_lora_settings(lora_cfg: LoraConfig) -> dict[str, Any]:
    """``model.lora`` in peft's words (``LoraConfig``'s and Unsloth's ``get_peft_model``'s
    keyword arguments), written once so that both backends build the same adapters."""
    return {
        "r": lora_cfg.r,
        "lora_alpha": lora_cfg.alpha,
        "lora_dropout": lora_cfg.dropout,
        "target_modules": list(lora_cfg.target_modules),
        "modules_to_save": list(lora_cfg.modules_to_save) or None,
    }


def add_lora(model: Any, lora_cfg: LoraConfig, seed: int) -> Any:
    """``model`` with LoRA adapters (deterministic per seed), as peft's ``LoraModel``."""
    import torch
    from peft import LoraConfig, LoraModel

    problems = unmatched_names(model, lora_cfg)
    if problems:
        raise ConfigValidationError(
            problems, footer="The model was loaded; nothing was trained or written."
        )
    config = LoraConfig(
        **peft_lora_settings(lora_cfg),
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


def save_adapters(model: Any, folder: Path, whole: dict[str, Any] | None = None) -> None:
    """Write the adapters as ``PeftModel.save_pretrained`` would (safetensors + config).
    ``whole``: ``model``'s trained parameters gathered from its shards (by their names in
    ``model``), which peft picks the adapters from as from a state dict of its own."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    lora = tuner(model)
    if whole is not None and lora is not model:
        prefix = next(n for n, m in model.named_modules() if m is lora) + "."
        whole = {k.removeprefix(prefix): v for k, v in whole.items()}
    state = get_peft_model_state_dict(lora, state_dict=whole, adapter_name=ADAPTER)
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
