"""Trackio, locally: ``trackio.init`` with ``TRACKIO_DIR`` inside the run folder (a
SQLite file per project), the resolved config, ``trackio.log`` for metrics and a
``trackio.Table`` per logged step's completions, ``trackio.finish``. The run's name is
kept in the run folder: a resume continues the same Trackio run (``resume="allow"``)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from art_hydra.trackers.base import Tracker, flat_config, register_tracker, sample_rows, table


log = logging.getLogger(__name__)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Trackio prints its banner and dashboard hints on stdout: into the run's log instead
    (a piped run's stdout stays the run's own)."""
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            yield
    finally:
        for line in printed.getvalue().splitlines():
            if line.strip():
                log.info("trackio: %s", line.strip())


@register_tracker("trackio")
class TrackioTracker(Tracker):
    def start(
        self,
        folder: Path,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        # Trackio's store (its default is under the Hugging Face cache in the home folder).
        os.environ["TRACKIO_DIR"] = str(folder)
        import trackio

        self.trackio = trackio
        name = resume_id or run_name
        with _quiet():
            self.run = trackio.init(
                project=project,
                name=name,
                config=flat_config(config),
                resume="allow" if resume_id else "never",
                auto_log_cpu=False,
                auto_log_gpu=False,
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
