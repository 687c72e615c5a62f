"""What loading a pretrained model would decide, decided from its folder's files first.

Three verdicts used to wait for the load (or never came): LoRA target and trained
module names, matched against the modules the safetensors header describes by the same
rules the run applies to the loaded model (:func:`~art_hydra.engine.backends.adapters.
lora_name_problems`), so that ``dry_run=true`` and the run agree; the dtype
``model.dtype=auto`` loads (config.json's, else the weights'), which decides whether
``model.master_weights=false`` can train or does nothing; and ``model.revision`` on a
local folder, which has no revisions. No torch: config.json and the header bytes only.
A folder the model check cannot read is its to report; these checks then say nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra import model_files
from art_hydra.config.backends import get_backend
from art_hydra.config.problems import Kind, Problem, fix
from art_hydra.config.schema import DType, FinetuneMethod, ModelSource
from art_hydra.engine.backends.adapters import ModuleTree, lora_name_problems
from art_hydra.model_files import FolderError, looks_local
from art_hydra.preflight.common import model_folder, world_problem


def model_load_problems(cfg: DictConfig) -> list[Problem]:
    """The load's verdicts on a pretrained model's folder (local, or a cached hub id)."""
    model = cfg.model
    if model.source != ModelSource.pretrained:
        return []
    problems = _revision_problems(cfg)
    try:
        folder = model_folder(model)
    except OSError:
        return problems  # the model check names a path that cannot be read
    if folder is None:
        return problems
    try:
        config = model_files.read_json_file(folder / "config.json")
        if not isinstance(config, dict):
            return problems
        tensors = model_files.folder_tensors(folder)
    except (FolderError, OSError):
        return problems  # the model check reports the folder's own flaws
    problems += _lora_problems(cfg, config, tensors)
    problems += _master_weight_problems(cfg, config, tensors, folder)
    return problems


def _revision_problems(cfg: DictConfig) -> list[Problem]:
    """A local folder is loaded as it is: ``revision`` names a branch, tag or commit of a
    hub repository, and ``from_pretrained`` ignores it for a folder."""
    revision, name = cfg.model.revision, str(cfg.model.name)
    if revision is None or not looks_local(name):
        return []
    return [
        world_problem(
            "model.revision",
            revision,
            f"is ignored: model.name={name} is a local folder, loaded as it is on disk; a "
            "revision (branch, tag or commit) chooses a version of a hub repository only.",
            fix({"model.revision": None}),
            warning=True,
        )
    ]


def _lora_problems(
    cfg: DictConfig, config: dict[str, Any], tensors: dict[str, model_files.Tensor]
) -> list[Problem]:
    """The run's LoRA name rules on the modules the header describes. Skipped where the
    header's names are not the loaded modules' (a family transformers renames or fuses at
    load, or code the folder ships): the run checks those after loading."""
    model = cfg.model
    if model.finetune != FinetuneMethod.lora or not tensors:
        return []
    model_type = config.get("model_type")
    renamed = model_files.renamed_at_load()
    architectures = config.get("architectures")
    arch = architectures[0] if isinstance(architectures, list) and architectures else None
    if (
        renamed is None
        or model_type in renamed
        or arch in renamed
        or "auto_map" in config
        or isinstance(config.get("text_config"), dict)
    ):
        return []
    modules, linear = model_files.module_names(config, tensors)
    label = str(arch or model_type or "the model")
    problems = lora_name_problems(ModuleTree(label, modules, linear), model.lora, Kind.world)
    return [_read_from_header(p) for p in problems]


def _read_from_header(problem: Problem) -> Problem:
    """The run's reason, saying that the names were read from the weights' header."""
    return Problem(
        problem.key,
        problem.value,
        f"{problem.reason} (Module names read from the folder's safetensors header; the run "
        "would refuse them after loading the model.)",
        problem.fix,
        problem.kind,
        problem.severity,
    )


def _master_weight_problems(
    cfg: DictConfig, config: dict[str, Any], tensors: dict[str, model_files.Tensor], folder: Path
) -> list[Problem]:
    """``model.master_weights=false`` under ``model.dtype=auto``: the dtype the folder
    loads in decides it (the torch backend decides it at load; the validator decides the
    explicit dtypes). float16 weights cannot train without float32 masters (refused, as
    the load would); float32 weights have no half weight to keep (the key does nothing)."""
    model = cfg.model
    backend = get_backend(cfg.backend.name)
    own_precision = backend is not None and backend.own_precision
    if (
        model.master_weights
        or model.dtype != DType.auto
        or model.finetune != FinetuneMethod.full
        or own_precision
    ):
        return []
    files, _ = model_files.weight_files(folder)
    found = model_files.checkpoint_dtype(config, tensors, files[0] if files else None)
    if found is None:
        return []
    dtype, where = found
    name = str(model.name)
    if dtype == "float16":
        return [
            world_problem(
                "model.master_weights",
                False,
                f"model.dtype=auto loads {name} in float16 ({where}), and float16 weights "
                "cannot train without float32 master weights: they overflow within a few "
                "steps, and loss scaling needs float32 weights to unscale the gradient into.",
                fix(
                    {"model.master_weights": True},
                    "float16 mixed precision",
                    alt=fix({"model.dtype": "bfloat16"}, "pure bfloat16 weights"),
                ),
            )
        ]
    if dtype in ("float32", "float64"):
        return [
            world_problem(
                "model.master_weights",
                False,
                f"does nothing: model.dtype=auto loads {name} in {dtype} ({where}), so no "
                "weight trains in a half type.",
                fix(
                    {"model.master_weights": True},
                    alt=fix({"model.dtype": "bfloat16"}, "pure bfloat16 weights"),
                ),
                warning=True,
            )
        ]
    return []
