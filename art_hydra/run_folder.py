"""The run folder's state: whether it holds a run, its checkpoints, its saved config.

A run folder belongs to one run. ``run_config.yaml`` records the resolved config the run
was started with: it is the reference a resume is compared with, so continuing a run
means continuing the same run (only the keys in :data:`MAY_CHANGE_ON_RESUME` may
differ, and each accepted change is recorded in ``resumes.jsonl``). Everything here is
plain files, no torch, so the CLI can check a folder before Hydra creates anything.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import time
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

#: The resolved config the run started with (updated by each accepted resume).
RUN_CONFIG = "run_config.yaml"
#: One line per accepted resume: when, from which step, what changed.
RESUMES = "resumes.jsonl"
METRICS = "metrics.jsonl"
#: A checkpoint folder is ``step-<n>`` (n >= 0, at least 6 digits).
CHECKPOINT_PREFIX = "step-"
STATE_FILE = Path("trainer_state") / "state.json"
_STEP = re.compile(r"^step-(\d+)$")

#: Keys a resume may change: how long the run goes on, how it reports and saves, how long
#: its waits last. Everything else is what the checkpoint's weights, optimizer state,
#: data order and metrics depend on.
MAY_CHANGE_ON_RESUME = (
    "trainer.max_steps",
    "checkpoint.every_steps",
    "checkpoint.keep_last",
    "logging.*",
    "queue.*",
    "producer.log_completions",
    "resume",
    "dry_run",
    "strict",
)


#: Switches of one invocation, not settings of the run: never recorded as a change.
_SWITCHES = ("resume", "dry_run")


def checkpoint_step(path: Path) -> int | None:
    """The step a checkpoint folder holds, from its name (None if it is not one)."""
    match = _STEP.match(path.name)
    return int(match.group(1)) if match else None


def checkpoint_folders(root: Path) -> list[Path]:
    """Checkpoint folders with a state file, oldest first, ordered by step number."""
    if not root.is_dir():
        return []
    found = [
        p for p in root.iterdir() if checkpoint_step(p) is not None and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: checkpoint_step(p) or 0)


def holds_run(run_dir: Path, checkpoint_dir: str) -> bool:
    """Whether ``run_dir`` already holds a run's record (Hydra's ``.hydra`` alone does not
    count: Hydra writes it before every job)."""
    return (
        (run_dir / RUN_CONFIG).is_file()
        or (run_dir / METRICS).is_file()
        or bool(checkpoint_folders(run_dir / checkpoint_dir))
    )


def run_config_text(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def saved_config(run_dir: Path) -> dict[str, Any] | None:
    path = run_dir / RUN_CONFIG
    if not path.is_file():
        return None
    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    return loaded if isinstance(loaded, dict) else None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flat(value, f"{prefix}{key}."))
        return out or {prefix.rstrip("."): {}}
    return {prefix.rstrip("."): node}


def plain(cfg: DictConfig) -> dict[str, Any]:
    container = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    assert isinstance(container, dict)
    return container


def differences(saved: dict[str, Any], cfg: DictConfig) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, new value)`` for every key that differs."""
    old, new = _flat(saved), _flat(plain(cfg))
    keys = sorted(set(old) | set(new))
    return [(k, old.get(k), new.get(k)) for k in keys if old.get(k) != new.get(k)]


def may_change(key: str) -> bool:
    return any(fnmatch.fnmatchcase(key, pattern) for pattern in MAY_CHANGE_ON_RESUME)


def write_run_config(run_dir: Path, cfg: DictConfig) -> None:
    """Record the run's config atomically (temp file, then rename)."""
    target = run_dir / RUN_CONFIG
    tmp = run_dir / f".{RUN_CONFIG}.{os.getpid()}.tmp"
    tmp.write_text(run_config_text(cfg))
    os.replace(tmp, target)


def record_resume(run_dir: Path, step: int, changed: list[tuple[str, Any, Any]]) -> None:
    """Append what an accepted resume changed, then make its config the reference."""
    entry = {
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "from_step": step,
        "changed": {key: [old, new] for key, old, new in changed if key not in _SWITCHES},
    }
    with open(run_dir / RESUMES, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(entry) + "\n")
