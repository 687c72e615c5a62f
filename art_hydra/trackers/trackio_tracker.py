"""Trackio, locally: ``trackio.init`` with ``TRACKIO_DIR`` inside the run folder (a
SQLite file per project; a sweep's jobs share the sweep folder's, one project, each run
in the sweep's group, named by its swept overrides, job number and the sweep's id,
unique across the sweeps one database may hold), the resolved
config, ``trackio.log`` for metrics and a ``trackio.Table`` per logged step's
completions, ``trackio.finish``. The run's name is
kept in the run folder: a resume continues the same Trackio run (``resume="allow"``);
one whose database moved since says so and starts a new run of that name there."""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from art_hydra.trackers.base import Tracker, flat_config, register_tracker, sample_rows, table
from art_hydra.trackers.placement import Place, SweepJob, set_ours

log = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Trackio prints its banner and dashboard hints on stdout: to the debug log instead
    (a piped run's stdout stays the run's own; docs/trackers.md says how to view the store)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield printed
    finally:
        for line in printed.getvalue().splitlines():
            if line.strip():
                log.debug("trackio: %s", line.strip())


#: Trackio's module-level paths, read from TRACKIO_DIR when trackio is first imported.
_PATHS = {"TRACKIO_DIR": "", "MEDIA_DIR": "media", "ARTIFACTS_DIR": "artifacts"}


def _repoint(folder: Path) -> None:
    """Trackio reads TRACKIO_DIR once, at its import, into module constants; a second run
    in the same process (a sweep's jobs under Hydra's basic launcher, ``train(cfg)``
    called twice) would write into the first run's folder. Point every loaded trackio
    module's copy at this run's folder."""
    import sys

    utils = sys.modules.get("trackio.utils")
    old = getattr(utils, "TRACKIO_DIR", None)
    if old is None or Path(old) == folder:
        return
    for name, module in list(sys.modules.items()):
        if name == "trackio" or name.startswith("trackio."):
            for attr, sub in _PATHS.items():
                if getattr(module, attr, None) == (Path(old) / sub if sub else Path(old)):
                    setattr(module, attr, folder / sub if sub else folder)


def _config(config: dict[str, Any], sweep: SweepJob | None) -> dict[str, Any]:
    """The flattened config, with the sweep's tags (sweep, sweep_dir, job) and any swept
    key the config does not hold by its name (a group choice) beside it."""
    flat = flat_config(config)
    if sweep is not None:
        flat.update({k: v for k, v in sweep.swept.items() if k not in flat})
        flat.update(sweep.tags())
    return flat


@register_tracker("trackio")
class TrackioTracker(Tracker):
    def start(
        self,
        where: Place,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        folder = where.folder
        # Trackio's store (its default is under the Hugging Face cache in the home folder);
        # a TRACKIO_DIR of the user's is theirs, left as it is.
        if not where.users:
            set_ours("TRACKIO_DIR", str(folder))
        import trackio

        _repoint(folder)

        self.trackio = trackio
        sweep = self.sweep
        name = resume_id or (sweep.unique_name if sweep is not None else run_name)
        with _quiet() as printed:
            self.run = trackio.init(
                project=project,
                name=name,
                group=sweep.name if sweep is not None else None,
                config=_config(config, sweep),
                resume="allow" if resume_id else "never",
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        if resume_id and "Resumed existing run" not in printed.getvalue():
            log.warning(
                "trackio: run %r, which this run reported to before, is not in %s (the "
                "database moved since the run started: logging.trackers_dir or TRACKIO_DIR "
                "changed). Its steps so far stay where it started; this resume reports to a "
                "new run of that name here.",
                name,
                where.shown,
            )
        return name

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self.run.log(metrics, step=step)

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        rows = sample_rows(step, kind, samples)
        if rows:
            columns, data = table(rows)
            tables = getattr(self.trackio, "Table", None)  # an older Trackio may have none
            if tables is not None:
                self.run.log({f"samples/{kind}": tables(columns=columns, data=data)}, step=step)

    def close(self, status: str) -> None:
        with _quiet():
            try:
                # trackio.finish also forgets the current run (else its exit hook
                # finishes it a second time, printing after the run's last line).
                self.trackio.finish()
            except RuntimeError:  # no current run in this thread
                self.run.finish()
