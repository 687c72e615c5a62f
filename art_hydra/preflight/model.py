"""A pretrained model's files, checked before anything loads them."""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from art_hydra import safe_json
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import (
    AlgorithmName,
    ModelSource,
)
from art_hydra.preflight.common import top_p_problems, world_problem
from art_hydra.safe_paths import file_refusal, path_refusal

#: The largest model config.json read (real ones are a few kilobytes).
CONFIG_MAX_BYTES = 4 << 20
#: Weight files that unpickle arbitrary objects when loaded: never loaded.
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")


def _looks_local(name: str) -> bool:
    return name.startswith(("/", "./", "../", "~")) or os.path.exists(os.path.expanduser(name))


def _hub_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(
        os.path.expanduser("~"), ".cache", "huggingface"
    )
    return Path(home) / "hub"


def _offline() -> bool:
    return any(
        os.environ.get(v, "").lower() in ("1", "true", "yes")
        for v in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


def model_problems(cfg: DictConfig) -> list[Problem]:
    """A pretrained model's name: in the hub cache when offline, or a local folder with a
    config and safetensors weights. Any ``OSError`` from the file system (a path no file
    can have, a folder that cannot be read) becomes a problem naming ``model.name``."""
    model = cfg.model
    if model.source != ModelSource.pretrained:
        return []
    name = str(model.name)
    refusal = path_refusal(os.path.expanduser(name))
    if refusal is None:
        try:
            return _model_problems(cfg, name)
        except OSError as exc:
            refusal = f"cannot be read ({exc.strerror or exc})"
    return [
        world_problem(
            "model.name",
            name,
            f"{refusal}.",
            fix({"model.name": placeholder("a hub id or the path of a local model folder")}),
        )
    ]


def _model_problems(cfg: DictConfig, name: str) -> list[Problem]:
    if not _looks_local(name):
        cached = _hub_cache() / f"models--{name.replace('/', '--')}" / "snapshots"
        if _offline() and not any(cached.glob("*/config.json")):
            return [
                world_problem(
                    "model.name",
                    name,
                    f"is not in the Hugging Face cache ({cached.parent}) and HF_HUB_OFFLINE is "
                    "set, so it cannot be downloaded.",
                    fix(
                        {"model.name": placeholder("the path of a local model folder")},
                        f"or download it once online: hf download {name}",
                    ),
                )
            ]
        return []
    folder = Path(os.path.expanduser(name))
    if not folder.is_dir():
        return [
            world_problem(
                "model.name",
                name,
                "looks like a local path, but no such folder exists"
                + ("" if folder.is_absolute() else f" (relative to {os.getcwd()})")
                + ".",
                fix({"model.name": placeholder("the absolute path of your model folder")}),
            )
        ]
    config_refusal = file_refusal(folder / "config.json")
    if config_refusal == "does not exist":
        return [
            world_problem(
                "model.name",
                name,
                "is a folder without config.json, so it holds no Hugging Face model.",
                fix(note="point model.name at the folder save_pretrained wrote"),
            )
        ]
    if config_refusal is not None:
        return [
            world_problem(
                "model.name",
                name,
                f"holds a config.json that {config_refusal}.",
                fix(note="point model.name at the folder save_pretrained wrote"),
            )
        ]
    safe = list(folder.glob("*.safetensors"))
    pickled = [p.name for pattern in PICKLE_WEIGHTS for p in folder.glob(pattern)]
    if not safe and pickled:
        return [
            world_problem(
                "model.name",
                name,
                f"holds only pickled weights ({', '.join(sorted(pickled))}); loading a pickle can "
                "run arbitrary code, so art_hydra loads weights only from safetensors.",
                fix(
                    note="convert once, where you trust the file: AutoModelForCausalLM."
                    "from_pretrained(folder).save_pretrained(folder, safe_serialization=True)"
                ),
            )
        ]
    if not safe:
        return [
            world_problem(
                "model.name",
                name,
                "holds no weights (*.safetensors).",
                fix(note="point model.name at the folder save_pretrained wrote"),
            )
        ]
    problems: list[Problem] = []
    if cfg.algorithm.name == AlgorithmName.rl:
        vocab = _local_vocab(folder)
        if vocab:
            problems += top_p_problems(cfg, vocab)
    return problems


def _local_vocab(folder: Path) -> int | None:
    try:
        config = safe_json.read(folder / "config.json", max_bytes=CONFIG_MAX_BYTES)
    except ValueError:
        return None
    if not isinstance(config, dict):
        return None
    vocab = config.get("vocab_size") or config.get("text_config", {}).get("vocab_size")
    return vocab if isinstance(vocab, int) and vocab > 0 else None
