"""How many ranks a run will have, known before any process starts: torchrun's
``WORLD_SIZE`` in a launched process, or the ranks per job of the launcher a sweep is
about to use. The validators check a config against it, the CLI and the distributed
set-up read it; and whether that launcher can start a job here at all. Plain Python, on
the compose path.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from omegaconf import DictConfig, OmegaConf

from art_hydra.config.problems import Kind, Problem, fix

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


#: The command a SLURM launcher runs each job's tasks with; submitit refuses to start a
#: SLURM executor where it is not on PATH.
SRUN = "srun"


def launcher_problems(launcher: DictConfig, option: str | None) -> list[Problem]:
    """What stops the sweep's launcher (``hydra.launcher``, chosen as ``hydra/launcher=
    option``) from starting a job on this machine, found before any job starts: a SLURM
    launcher without ``srun`` (not a SLURM cluster, or its tools not on PATH), which
    submitit would refuse only once the first batch is launched, with a traceback."""
    target = str(OmegaConf.select(launcher, "_target_", default="") or "")
    if not target.endswith("SlurmLauncher") or shutil.which(SRUN) is not None:
        return []
    return [
        Problem(
            "hydra/launcher",
            option or target,
            f"submits each job to SLURM, and this machine has no '{SRUN}' on PATH: it is "
            "not a SLURM cluster's login node (or SLURM's tools are not on PATH), so no job "
            "could be submitted.",
            fix(
                {"hydra/launcher": LOCAL_TWIN},
                "the same multi-rank jobs as local processes on this machine, to try the sweep",
                alt=fix(note=f"run the sweep on a SLURM login node, where {SRUN} is on PATH"),
            ),
            Kind.world,
        )
    ]


#: The SLURM preset's twin on one machine (conf/hydra/launcher/slurm_local.yaml).
LOCAL_TWIN = "slurm_local"
