"""A single run the command checked, taken to its end: the ranks meet, Hydra runs the job.

The command composes and checks a single run once, before anything exists
(:mod:`art_hydra.commands.cli`); what follows runs exactly that composition, and composes or
checks nothing again. Under torchrun the ranks form their process group first and take
rank 0's run folder: each rank resolving ``${now:...}`` and ``${art_hydra.unique:}`` on
its own would name another one. Hydra learns that folder through its own config
(``hydra.run.dir``; the other ranks keep no ``.hydra`` record and log to
``art_hydra_rank<N>.log``). Hydra's job runner then makes the folder, its logging and
the callbacks as for any Hydra app, and the job trains the checked config. How a job
ends on a user's mistake or a known stop (:func:`as_job`) is the same for a sweep's job,
which the command's Hydra task function runs.

Nothing here imports torch until the ranks meet (a single process never does here).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from hydra.core.config_loader import ConfigLoader
from hydra.errors import CompactHydraException
from omegaconf import DictConfig, OmegaConf, read_write

from art_hydra import workers
from art_hydra.config import hydra_compat, secrets
from art_hydra.config.composition import Composition, in_run_folder
from art_hydra.config.problems import ConfigValidationError
from art_hydra.config.trust import by_hand
from art_hydra.errors import Interrupted, full_error


def report_and_exit(exc: CompactHydraException) -> None:
    """A user's mistake or a run stopped for a known reason: its message alone on
    stderr (no traceback, no HYDRA_FULL_ERROR hint), and its exit status (1, or 130/143
    after SIGINT/SIGTERM/SIGHUP)."""
    try:
        sys.stderr.write(str(exc).rstrip() + "\n")
        sys.stderr.flush()
    except OSError:  # after SIGHUP the terminal may be gone: the status still tells
        logging.shutdown()
        os._exit(getattr(exc, "exit_code", 1))  # flushing it again at exit would fail (120)
    code = getattr(exc, "exit_code", 1)
    if workers.running():
        # Work that overran its bound still runs in a daemon thread (a stuck step, a hung
        # reward); finalizing the interpreter under it can abort. Leave at once.
        sys.stdout.flush()
        sys.stderr.flush()
        logging.shutdown()
        os._exit(code)
    sys.exit(code)


def run_checked(
    checked: Composition,
    loader: ConfigLoader,
    config_name: str | None,
    overrides: list[str],
) -> Any:
    """Run ``checked`` (composed with ``keep_composed``, checked without an error) as
    Hydra's single-run job, which trains it; returns the job's value."""
    world, checked = meet_the_other_ranks(checked, loader, config_name, overrides)
    assert checked.composed is not None
    # The run's records keep its environment reads as expressions; its log, no secret.
    secrets.remember(checked.composed)

    def task(_task_cfg: Any) -> Any:
        with secrets.scrubbing_logs():
            return _checked_job(checked, world)

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
    from art_hydra.engine import distributed

    if not distributed.from_environment().enabled:
        return None, checked
    from art_hydra.config.typed import typed_config
    from art_hydra.run import prepared_world

    assert checked.resolved is not None and checked.composed is not None
    world = prepared_world(typed_config(checked.resolved))
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


def _checked_job(checked: Composition, world: Any) -> Any:
    """The job of a single run the command checked: it trains the checked config."""
    from art_hydra.run import default_run_dir, train_checked

    def run() -> Any:
        assert checked.resolved is not None
        anchor_paths(checked.resolved)
        with by_hand(checked.hand):
            return train_checked(checked.resolved, default_run_dir(), world)

    return as_job(run)


def as_job(run: Callable[[], Any]) -> Any:
    """Run a job's work: a user's mistake or a known stop ends it with its report alone
    (in a sweep it goes back to the sweeper, in another process under joblib or
    submitit, which reports it)."""
    from art_hydra.runs.run_folder import discard_hydra_record, in_sweep

    try:
        return run()
    except CompactHydraException as exc:
        if full_error() or (in_sweep() and not isinstance(exc, Interrupted)):
            raise
        report_and_exit(exc)
    finally:
        discard_hydra_record()  # a job that never held the folder's lock leaves no record


#: Keys that may name a file or folder given relative to the folder the command was
#: launched from (each with the condition under which it is a path at all).
PATH_KEYS = (("task.path", None), ("model.name", ("model.source", "pretrained")))


def anchor_paths(cfg: DictConfig) -> None:
    """Under ``hydra.job.chdir=true`` Hydra runs the job inside its run folder, while the
    pre-flight checked relative paths against the launch folder: such a path that exists
    there is made absolute, so the job reads what was checked (a hub id, which names no
    file there, is left as it is)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    if not hydra_cfg.job.get("chdir"):
        return
    launch = hydra_cfg.runtime.cwd
    for key, when in PATH_KEYS:
        try:
            value = OmegaConf.select(cfg, key)
            chosen = OmegaConf.select(cfg, when[0]) if when else None
            # An enum field reads back as the enum (ModelSource.pretrained): its name counts.
            applies = when is None or getattr(chosen, "name", chosen) == when[1]
        except Exception:  # a value that does not resolve: the job's check reports it
            continue
        if not applies or not isinstance(value, str) or not value:
            continue
        if os.path.isabs(value) or value.startswith("~"):
            continue
        there = os.path.join(launch, value)
        if os.path.lexists(there):
            OmegaConf.update(cfg, key, os.path.normpath(there), merge=False)
