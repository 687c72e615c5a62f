"""A single run the command checked, taken to its end: the ranks meet, Hydra runs the job.

The command composes and checks a single run once, before anything exists
(:mod:`art_hydra.cli`); what follows runs exactly that composition, and composes or
checks nothing again. Under torchrun the ranks form their process group first and take
rank 0's run folder: each rank resolving ``${now:...}`` and ``${art_hydra.unique:}`` on
its own would name another one. Hydra learns that folder through its own config
(``hydra.run.dir``; the other ranks keep no ``.hydra`` record and log to
``art_hydra_rank<N>.log``). Hydra's job runner then makes the folder, its logging and
the callbacks as for any Hydra app, and the job trains the checked config.

Nothing here imports torch until the ranks meet (a single process never does here).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hydra.core.config_loader import ConfigLoader
from omegaconf import read_write

from art_hydra.config import hydra_compat, secrets
from art_hydra.config.composition import Composition, in_run_folder
from art_hydra.config.problems import ConfigValidationError

#: ``job(checked, world)``: the job's work, given the checked run and the process group
#: its rank joined (None: a single process).
Job = Callable[[Composition, Any], Any]


def run_checked(
    checked: Composition,
    loader: ConfigLoader,
    config_name: str | None,
    overrides: list[str],
    job: Job,
) -> Any:
    """Run ``checked`` (composed with ``keep_composed``, checked without an error) as
    Hydra's single-run job; returns the job's value."""
    world, checked = meet_the_other_ranks(checked, loader, config_name, overrides)
    assert checked.composed is not None
    # The run's records keep its environment reads as expressions; its log, no secret.
    secrets.remember(checked.composed)

    def task(_task_cfg: Any) -> Any:
        with secrets.scrubbing_logs():
            return job(checked, world)

    return hydra_compat.run_composed(checked.composed, config_name, loader, task)


def meet_the_other_ranks(
    checked: Composition,
    loader: ConfigLoader,
    config_name: str | None,
    overrides: list[str],
) -> tuple[Any, Composition]:
    """Under torchrun: join the process group (every rank has passed the same checks) and
    move this rank's run into rank 0's folder (:func:`in_run_folder`); returns the
    rank's world and its run. A single process: ``(None, checked)``, nothing imported."""
    from art_hydra import distributed

    if not distributed.from_environment().enabled:
        return None, checked
    from art_hydra.backends import prepare
    from art_hydra.config.typed import typed_config

    assert checked.resolved is not None and checked.composed is not None
    typed = typed_config(checked.resolved)
    prepare(typed.backend)  # Unsloth must come before transformers (and torch's imports)
    from art_hydra.backends.torch_backend import resolve_device

    world = distributed.setup(typed.distributed, resolve_device(typed.backend.device))
    folder = distributed.broadcast_object(world, checked.run_dir)
    checked = in_run_folder(checked, folder, loader, config_name, overrides)
    if not checked.ok:
        raise ConfigValidationError(
            checked.problems,
            footer=f"Rank {world.rank}'s config in rank 0's run folder {folder}; nothing was "
            "trained.",
        )
    if not world.is_main:
        assert checked.composed is not None
        hydra = checked.composed.hydra
        with read_write(hydra):
            hydra.output_subdir = None
            hydra.job.name = f"art_hydra_rank{world.rank}"
    return world, checked
