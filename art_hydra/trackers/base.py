"""What every tracker shares: the registry, the protocol, and the flattening of metric
records, sample rows and configs into what tracker libraries take.

Trackers through their own libraries: TensorBoard, W&B, MLflow and Trackio.

One class per tracker, registered under its ``logging.report_to`` name with
:func:`register_tracker`. Each imports its library inside :meth:`Tracker.start` (never
at import time: the compose path and runs that chose no tracker import none of them) and
writes only inside the run folder (its ``trackers/`` folder, TensorBoard's own
``tensorboard/``) or, for a sweep's job, its sweep folder's ``trackers/`` (the stores
the sweep's jobs share), unless the user pointed a library elsewhere (its own variable,
or ``logging.trackers_dir``): the environment variables that would send a library's
files to the home directory or the working directory are pointed there first. The run's
:class:`~art_hydra.engine.metrics.MetricsLog` fans its metrics, samples and end out to every
tracker the run chose; a tracker that fails after it started is dropped with a warning
(the run's own outcome matters more than a dashboard).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

from art_hydra.config.tracker_names import LIBRARIES
from art_hydra.trackers.placement import Place, SweepJob

log = logging.getLogger(__name__)

#: Tracker name -> its class.
TRACKERS: dict[str, type[Tracker]] = {}


def register_tracker(name: str) -> Callable[[type[Tracker]], type[Tracker]]:
    """Register a :class:`Tracker` class under ``logging.report_to`` name ``name``."""

    def add(cls: type[Tracker]) -> type[Tracker]:
        if name not in LIBRARIES:
            raise ValueError(f"{name!r} is not in art_hydra.config.tracker_names.LIBRARIES")
        cls.name = name
        TRACKERS[name] = cls
        return cls

    return add


class Tracker:
    """What every tracker does; a subclass overrides what its library offers."""

    name = ""
    #: The checkpoint's step on a resume (None: a fresh run), set before :meth:`start`.
    resume_step: int | None = None
    #: The sweep this run is a job of (None: a single run), set before :meth:`start`:
    #: the tracker groups and tags the run with it and records the swept keys.
    sweep: SweepJob | None = None

    def start(
        self,
        where: Place,
        config: dict[str, Any],
        run_name: str,
        project: str,
        resume_id: str | None,
    ) -> str | None:
        """Open the tracker's run, its files under ``where.folder`` (the run folder's,
        the sweep's, or the user's choice: :mod:`art_hydra.trackers.placement`);
        ``resume_id`` is the id this returned when the run started, on a resume. Returns
        the id to keep for the next resume (None: nothing to keep)."""
        raise NotImplementedError

    def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
        """One logged step's numeric metrics (keys as in metrics.jsonl)."""

    def track_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        """A step's sample completions (``kind``: train or eval), rows of either shape
        (:func:`sample_rows` flattens them)."""

    def summary(self, hparams: dict[str, Any], values: dict[str, float]) -> None:
        """The job's hyperparameters (its overrides and status) and its objective."""

    def close(self, status: str) -> None:
        """Finish the tracker's run: ``status`` is done, failed or interrupted."""


#: Columns of a sample table, in order; a row's other fields follow as JSON text.
COLUMNS = ("step", "kind", "group", "prompt", "reference", "completion", "reward", "advantage")


def sample_rows(step: int, kind: str, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One flat row per completion, from grouped rows (``{"prompt", "reference",
    "completions": [{"text", "reward", "rewards", "advantage"}]}``) and flat rows
    (``{"prompt", "reference", "completion", "reward", "rewards", ...}``) alike; each
    per-reward score becomes a ``reward/<name>`` column."""
    rows: list[dict[str, Any]] = []
    for group, sample in enumerate(samples):
        if not isinstance(sample, dict):
            continue
        completions = sample.get("completions")
        if isinstance(completions, list):
            items = [c if isinstance(c, dict) else {"text": c} for c in completions]
        else:
            items = [{**sample, "text": sample.get("completion")}]
        for item in items:
            row: dict[str, Any] = {
                "step": step,
                "kind": str(sample.get("kind") or kind),
                "group": group,
                "prompt": _text(sample.get("prompt")),
                "reference": _text(sample.get("reference", sample.get("answer"))),
                "completion": _text(item.get("text")),
                "reward": _number(item.get("reward")),
                "advantage": _number(item.get("advantage")),
            }
            for name, score in sorted((item.get("rewards") or {}).items()):
                row[f"reward/{name}"] = _number(score)
            rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Rows as one table: the columns every row may have (per-reward columns after the
    fixed ones) and each row's values (None where a row lacks one)."""
    extra = sorted({k for r in rows for k in r if k not in COLUMNS})
    columns = [*COLUMNS, *extra]
    return columns, [[r.get(c) for c in columns] for r in rows]


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def numeric(record: dict[str, Any]) -> dict[str, float]:
    """The record's finite numbers (``step`` and text such as ``time`` left out)."""
    return {
        k: float(v)
        for k, v in record.items()
        if k != "step"
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


def flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``a.b.c`` keys (MLflow's params, Trackio's config)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flat_config(value, f"{name}."))
        else:
            out[name] = value
    return out
