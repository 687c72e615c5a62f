"""What a job returns and what it leaves behind: the objective, ``result.json``.

A sweeper that optimises (Optuna, Ax, Nevergrad) reads each job's return value as one
float, so :func:`art_hydra.train` returns a :class:`RunResult`: a ``float`` whose value
is the run's objective (``objective.*``: a logged metric reduced over the last logged
steps) and which still carries the run's summary (``result.run_dir``,
``result["final"]``), so callers that read the summary keep working.

Every job also writes ``<run_dir>/result.json`` (atomically): ``running`` when it
takes the folder (with its pid and host, so a summary can tell a live job from one
killed by SIGKILL or the OOM killer), then ``done``, ``failed`` (with the error) or
``interrupted`` (with the signal) when it ends. A sweep's pre-flight writes
``refused`` for a point it never launches (:func:`write_refused_result`), in the same
schema. :mod:`art_hydra.sweeps.summary` reads these files. No torch here.
"""

from __future__ import annotations

import math
import os
import signal
import socket
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from art_hydra.config import run_files
from art_hydra.config.objective import (
    CONDITIONAL_METRICS,
    RL_STAT_METRICS,
    STEP_METRICS,
    ObjectiveSpec,
    loss_metrics,
    reduce_values,
    resolve,
)

#: The record's file name in a job's folder.
RESULT = run_files.RESULT
#: Bumped when a field changes meaning; readers accept what they know.
SCHEMA_VERSION = 1
#: The states a record takes.
RUNNING, DONE, FAILED, INTERRUPTED, REFUSED = "running", "done", "failed", "interrupted", "refused"


class RunResult(float):
    """A run's objective as a float (what a sweeper optimises), carrying the run's
    summary: ``result["steps"]``, ``result.get("final")`` and ``result.steps`` read it,
    and a result equals a mapping with the same summary (``train(dry) == {"dry_run":
    True}``). NaN when the run logged no value of the objective's metric."""

    summary: dict[str, Any]

    def __new__(cls, value: float, summary: Mapping[str, Any] | None = None) -> RunResult:
        self = super().__new__(cls, value)
        self.summary = dict(summary or {})
        return self

    def __reduce__(self) -> tuple[Any, ...]:
        # A joblib or submitit launcher sends the return value back pickled.
        return (RunResult, (float(self), self.summary))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "summary":
            raise AttributeError(name)
        try:
            return self.summary[name]
        except KeyError:
            raise AttributeError(name) from None

    def __getitem__(self, key: str) -> Any:
        return self.summary[key]

    def __contains__(self, key: object) -> bool:
        return key in self.summary

    def get(self, key: str, default: Any = None) -> Any:
        return self.summary.get(key, default)

    def keys(self) -> Any:
        return self.summary.keys()

    def items(self) -> Any:
        return self.summary.items()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.summary == dict(other)
        return float.__eq__(self, other)  # type: ignore[operator]

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = float.__hash__

    def __repr__(self) -> str:
        return f"RunResult({float(self)!r}, {self.summary!r})"


# ---- the objective ---------------------------------------------------------------


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def objective_value(spec: ObjectiveSpec, rows: list[dict[str, Any]]) -> float:
    """The objective over the logged rows (oldest first): the metric's finite values in
    the last ``window`` rows, reduced; NaN when there is none."""
    window = rows[-spec.window :] if rows else []
    values = [r[spec.metric] for r in window if _finite(r.get(spec.metric))]
    return reduce_values(values, spec.reduce)


def windowed_metrics(spec: ObjectiveSpec, rows: list[dict[str, Any]]) -> dict[str, float]:
    """Every logged metric reduced over the objective's window, as the objective is."""
    window = rows[-spec.window :] if rows else []
    out: dict[str, float] = {}
    names = (*STEP_METRICS, *RL_STAT_METRICS, *CONDITIONAL_METRICS, *loss_metrics())
    for name in dict.fromkeys(names):
        values = [r[name] for r in window if _finite(r.get(name))]
        if values:
            out[name] = reduce_values(values, spec.reduce)
    return out


# ---- the job's place in a sweep ------------------------------------------------------


def job_overrides() -> list[str]:
    """The job's own overrides under Hydra (``hydra.overrides.task``), else [], as a
    record shows them (a secret-looking key's value as ``***``)."""
    from hydra.core.hydra_config import HydraConfig

    from art_hydra.config.secrets import redacted_overrides

    if not HydraConfig.initialized():
        return []
    return redacted_overrides([str(o) for o in HydraConfig.get().overrides.task])


def job_number() -> int | None:
    """The job's number in its sweep (``hydra.job.num``), None outside a Hydra job."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return None
    num = OmegaConf.select(HydraConfig.get(), "job.num", default=None)
    return int(num) if isinstance(num, int) else None


def _now() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


def write_record(run_dir: Path, record: dict[str, Any]) -> Path:
    """Write ``record`` as ``<run_dir>/result.json`` (temp file, then rename; never
    through a link planted in the folder)."""
    import json

    from art_hydra.config.secrets import scrub_data
    from art_hydra.runs.run_folder import write_atomic

    record = scrub_data(record)  # a failure's message may quote a secret's value
    path = Path(run_dir) / RESULT
    write_atomic(path, json.dumps(record, indent=2, allow_nan=True) + "\n")
    return path


def _base(status: str, overrides: list[str], job_num: int | None) -> dict[str, Any]:
    return {
        "schema": SCHEMA_VERSION,
        "status": status,
        "reason": None,
        "job_num": job_num,
        "overrides": list(overrides),
        "objective": None,
        "final": {},
        "windowed": {},
        "steps": 0,
        "max_steps": None,
        "wall_time_s": None,
        "started": None,
        "finished": None,
        "pid": os.getpid(),
        "host": socket.gethostname(),
    }


def write_refused_result(
    run_dir: str | Path, overrides: list[str], problems_text: str, job_num: int | None
) -> Path | None:
    """Record a sweep point the pre-flight refused (it never launches): ``status:
    refused`` with the report as its reason, in the job folder the point would have had
    (created here). For the sweep's pre-flight, which knows the folder and the point.
    A folder that already holds a record (another job ran there) keeps it: None."""
    folder = Path(run_dir)
    if os.path.lexists(folder / RESULT):
        return None
    folder.mkdir(parents=True, exist_ok=True)
    record = _base(REFUSED, overrides, job_num)
    record.update(reason=problems_text.strip(), finished=_now(), pid=None, host=None)
    path = write_record(folder, record)
    from art_hydra.runs.run_folder import claim

    claim(folder, [RESULT])  # the job that runs there later replaces it: a run's own record
    return path


class JobRecord:
    """One job's ``result.json`` from the moment it holds its folder: ``running`` at
    :meth:`start`, its end state at :meth:`finish`. The run updates :attr:`steps`."""

    def __init__(self, run_dir: Path, cfg: Any) -> None:
        self.run_dir = Path(run_dir)
        self.spec = resolve(cfg.objective, cfg.algorithm.name)
        self.max_steps = int(cfg.trainer.max_steps)
        self.steps = 0
        self.overrides = job_overrides()
        self.job_num = job_number()
        self._started = _now()
        self._clock = time.monotonic()

    def _record(self, status: str) -> dict[str, Any]:
        record = _base(status, self.overrides, self.job_num)
        record.update(
            objective={**self.spec.as_dict(), "value": None},
            steps=self.steps,
            max_steps=self.max_steps,
            started=self._started,
            run_dir=str(self.run_dir),
        )
        return record

    def start(self) -> None:
        """Mark the folder's job as running (pid and host: a summary tells a job killed
        by SIGKILL, whose pid is gone, from a live one)."""
        write_record(self.run_dir, self._record(RUNNING))

    def finish(self, status: str, reason: str | None = None) -> tuple[float, dict[str, Any]]:
        """Write the end state, with the objective over the logged metrics; returns the
        objective and the record."""
        from art_hydra.engine.metrics import read_metrics

        rows = read_metrics(self.run_dir)
        value = objective_value(self.spec, rows)
        record = self._record(status)
        record["objective"]["value"] = value if math.isfinite(value) else None
        record.update(
            reason=reason,
            final=rows[-1] if rows else {},
            windowed=windowed_metrics(self.spec, rows),
            wall_time_s=round(time.monotonic() - self._clock, 3),
            finished=_now(),
        )
        write_record(self.run_dir, record)
        return value, record


def stop_reason(exc: BaseException) -> tuple[str, str]:
    """The end state and reason of a run that raised ``exc``: a stop signal is
    ``interrupted`` (its name), anything else ``failed`` (its message)."""
    from art_hydra.errors import Interrupted

    if isinstance(exc, KeyboardInterrupt):
        return INTERRUPTED, "SIGINT"
    if isinstance(exc, Interrupted):
        code = getattr(exc, "exit_code", 0)
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = "a stop signal"
        return INTERRUPTED, name
    message = str(exc).strip() or type(exc).__name__
    return FAILED, message


def hparams_of(overrides: list[str]) -> dict[str, Any]:
    """The job's overrides as TensorBoard hparams (``key -> int | float | bool | str``;
    ``+``/``~`` prefixes kept off the key, values that are not scalars kept as text)."""
    out: dict[str, Any] = {}
    for override in overrides:
        key, sep, text = override.partition("=")
        if not sep:
            continue
        out[key.lstrip("+~")] = _scalar(text)
    return out


def _scalar(text: str) -> Any:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if kind is int or math.isfinite(value) else text
    return text
