"""Builders shared by the engine tests: the real tiny model, task and trainer."""

from __future__ import annotations

import copy
from typing import Any

from art_hydra import compose
from art_hydra.engine.backends import load_model
from art_hydra.tasks import build_task

#: A small, quick configuration of the default job.
QUICK = [
    "trainer.max_steps=4",
    "checkpoint.every_steps=2",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


def tiny(overrides: list[str] | None = None) -> tuple[Any, Any, Any]:
    """(cfg, loaded model, task) for the tiny model on the reverse task."""
    cfg = compose([*QUICK, *(overrides or [])])
    task = build_task(cfg)
    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=task.charset())
    return cfg, loaded, task


def with_values(cfg: Any, values: dict[str, Any]) -> Any:
    """A copy of ``cfg`` with the dotted keys in ``values`` set: a component built from it
    sees other settings than the trainer built from ``cfg`` (the mismatches these tests
    stage on purpose, which validation would refuse)."""
    from omegaconf import OmegaConf

    changed = copy.deepcopy(cfg)
    for key, value in values.items():
        OmegaConf.update(changed, key, value)
    return changed
