"""How many ranks a run will have, known before any process starts: torchrun's
``WORLD_SIZE`` in a launched process, or the ranks per job of the launcher a sweep is
about to use. The validators check a config against it, the CLI and the distributed
set-up read it; plain Python, on the compose path.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from omegaconf import DictConfig

#: Ranks per job of the launcher a sweep is about to use (set by the pre-flight sweeper
#: while it checks the points of a SLURM/submitit sweep; None otherwise).
_launch_plan: ContextVar[int | None] = ContextVar("launch_plan", default=None)


def torchrun_world_size() -> int | None:
    """The world size torchrun (or a submitit task) set in WORLD_SIZE, or None."""
    value = os.environ.get("WORLD_SIZE")
    return int(value) if value and value.isdigit() else None


def launched_world_size() -> int | None:
    """The ranks this job runs on: WORLD_SIZE in a launched process, else the ranks per
    job of the launcher about to start it, else None (one process)."""
    return torchrun_world_size() or _launch_plan.get()


@contextmanager
def planned_launch(ranks: int | None) -> Iterator[None]:
    """Check configs as jobs of a launcher that starts ``ranks`` processes per job."""
    token = _launch_plan.set(ranks)
    try:
        yield
    finally:
        _launch_plan.reset(token)


def world_size(cfg: DictConfig) -> int:
    """Ranks the run has: ``distributed.world_size``, else the launcher's, else 1."""
    return cfg.distributed.world_size or launched_world_size() or 1
