"""The trackers a run reports to (``logging.report_to``), started and fanned out to
together; each tracker's own module holds its library's calls (see
:mod:`art_hydra.trackers.base` for the protocol and the registry)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_hydra.config import run_files
from art_hydra.config.secrets import SHOWN, reads_environment, redacted, scrub_data
from art_hydra.config.tracker_names import TENSORBOARD, chosen_trackers, project_name
from art_hydra.runs.run_folder import UnsafePath, entry_kind, read_record, write_atomic
from art_hydra.trackers import (  # noqa: F401  (each registers its tracker)
    mlflow_tracker,
    tensorboard_tracker,
    trackio_tracker,
    wandb_tracker,
)
from art_hydra.trackers.base import TRACKERS, Tracker, numeric
from art_hydra.trackers.placement import Place, SweepJob, place, sweep_job

if TYPE_CHECKING:
    from art_hydra.config.schema import LoggingConfig

log = logging.getLogger(__name__)


class TrackerStartError(RuntimeError):
    """A tracker the run chose could not start (before the first step)."""


class Trackers:
    """The trackers a run chose, started together; each call reaches every tracker, and
    one that raises is dropped with a warning naming it."""

    def __init__(self, trackers: list[Tracker]) -> None:
        self.trackers = trackers

    def __bool__(self) -> bool:
        return bool(self.trackers)

    def get(self, name: str) -> Tracker | None:
        return next((t for t in self.trackers if t.name == name), None)

    def _each(self, what: str, call: Callable[[Tracker], None]) -> None:
        for tracker in list(self.trackers):
            try:
                call(tracker)
            except Exception as exc:
                log.warning(
                    "%s: %s failed (%s); the run goes on without it", tracker.name, what, exc
                )
                self.trackers.remove(tracker)

    def log_metrics(self, record: dict[str, Any]) -> None:
        values = numeric(record)
        self._each("logging metrics", lambda t: t.log_metrics(record["step"], values))

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        if samples:
            samples = scrub_data(samples)
            self._each("logging samples", lambda t: t.track_samples(step, kind, samples))

    def summary(self, hparams: dict[str, Any], values: dict[str, float]) -> None:
        hparams = redacted(hparams)  # a secret-looking override's value as ***
        self._each("writing the summary", lambda t: t.summary(hparams, values))

    def close(self, status: str) -> None:
        for tracker in self.trackers:
            try:
                tracker.close(status)
            except Exception as exc:
                log.warning("%s: closing failed (%s)", tracker.name, exc)
        self.trackers = []


def _project(logging_cfg: LoggingConfig, config: dict[str, Any]) -> str:
    """The trackers' project name: ``logging.project``, else ``art-hydra-<task.name>``,
    but never a value the redacted ``config`` hides (shown as an expression or ``***``):
    ``art-hydra-run`` then."""

    def hidden(section: str, key: str) -> bool:
        node = config.get(section)
        value = node.get(key) if isinstance(node, dict) else None
        return isinstance(value, str) and (SHOWN in value or reads_environment(value))

    if logging_cfg.project:
        return "art-hydra-run" if hidden("logging", "project") else str(logging_cfg.project)
    node = config.get("task")
    task = node.get("name") if isinstance(node, dict) else None
    return project_name(logging_cfg, "run" if hidden("task", "name") else str(task or "run"))


def _ready(name: str, where: Place, run_dir: Path) -> None:
    """Make ``where``'s folder, refusing a link or file on the way where art_hydra chose
    the folder (inside the run or sweep folder): files would be written through it."""
    if where.users or (where.uri and not where.uri.startswith("file:")):
        return
    inside = [p for p in (where.folder.parent, where.folder) if p.name != ""]
    for path in inside:
        if entry_kind(path) not in (None, "folder"):
            raise UnsafePath(
                f"{path} is a {entry_kind(path)}, not a folder of the run's: {name}'s "
                f"files would be written through it. Remove it, or drop {name} from "
                "logging.report_to."
            )
    where.folder.mkdir(parents=True, exist_ok=True)


def _where(
    name: str, run_dir: Path, logging_cfg: LoggingConfig, sweep: SweepJob | None, resuming: bool
) -> Place:
    if name == TENSORBOARD:  # its event folder where it always was
        folder = run_dir / run_files.TENSORBOARD
        return Place(folder, run_files.TENSORBOARD)
    trackers_dir = getattr(logging_cfg, "trackers_dir", None)  # absent from a bare node
    return place(name, run_dir, str(trackers_dir) if trackers_dir else None, sweep, resuming)


def open_trackers(
    run_dir: Path,
    logging_cfg: LoggingConfig,
    config: dict[str, Any] | None,
    resume_step: int | None,
) -> Trackers:
    """Start the trackers ``logging_cfg`` chose for the run in ``run_dir``; ``config``
    is the resolved config as plain data; ``resume_step`` the checkpoint's step on a
    resume (None: a fresh run). The id each returns is kept in ``trackers/<name>.id``,
    and a resume hands it back so the tracker continues the same run. A sweep's job is
    named by its swept overrides and grouped under its sweep
    (:mod:`art_hydra.trackers.placement` says where each tracker reports)."""
    names = chosen_trackers(logging_cfg)
    # Every tracker's record goes through the redaction, whoever called (a no-op on a
    # config redacted already): expressions and ***, never a secret's value.
    config = redacted(config or {})
    project = _project(logging_cfg, config)
    run_dir = Path(run_dir)
    sweep = sweep_job()
    run_name = sweep.run_name if sweep is not None else run_dir.name
    started: list[Tracker] = []
    for name in names:
        where = _where(name, run_dir, logging_cfg, sweep, resume_step is not None)
        if name != TENSORBOARD:
            _ready(name, where, run_dir)
            (run_dir / run_files.TRACKERS).mkdir(exist_ok=True)
        id_file = run_dir / run_files.TRACKERS / f"{name}.id"
        saved = read_record(id_file) if resume_step is not None else None
        tracker = TRACKERS[name]()
        tracker.resume_step = resume_step
        tracker.sweep = sweep
        began = time.perf_counter()
        try:
            kept = tracker.start(where, config, run_name, project, (saved or "").strip() or None)
        except Exception as exc:
            Trackers(started).close("failed")
            raise TrackerStartError(
                f"logging.report_to: {name} did not start: {type(exc).__name__}: {exc}. "
                f"Drop it from logging.report_to to run without it."
            ) from exc
        if kept:
            write_atomic(id_file, kept)
        # TensorBoard, the default, says nothing (a default run's output stays as it was).
        log.log(
            logging.DEBUG if name == TENSORBOARD else logging.INFO,
            "%s: reporting to %s, %s %s, run %r%s (started in %.1f s)",
            name,
            where.shown,
            "experiment" if name == "mlflow" else "project",
            project,
            sweep.unique_name if sweep is not None and name == "trackio" else run_name,
            f", group {sweep.name}" if sweep is not None and name != "mlflow" else "",
            time.perf_counter() - began,
        )
        started.append(tracker)
    return Trackers(started)
