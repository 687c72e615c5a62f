"""The columns a sweep's summary compares jobs by: one per swept key (its value as
Hydra's override parser reads it, so ``1e-4`` is a float and ``true`` a bool), every
final metric a job logged (rewards by name, ``eval/*``, ``sampling_mismatch_*``, loss,
throughput), and the points aggregated over seeds (mean, std and n of the objective
and the main metrics), because one seed of an RL run says little about a point.

Plain Python (no torch): the summary runs in a sweep's parent process.
"""

from __future__ import annotations

import functools
import json
import math
import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_hydra import safe_json
from art_hydra.config import run_files
from art_hydra.config.objective import STEP_METRICS

#: The key that picks a job's seed (schema's ``seed``): points that differ only in it
#: are one point, aggregated.
SEED_KEY = "seed"
#: Metric keys of a metrics.jsonl line that are not metrics.
_NOT_METRICS = frozenset({"step", "time"})
#: Metrics aggregated over seeds beside the objective, when logged.
MAIN_METRICS = ("reward_mean", "loss")
#: The largest metrics.jsonl read for curves and eval values (a short run's is kilobytes).
METRICS_MAX_BYTES = 64 << 20


@functools.lru_cache(maxsize=1)
def _parser() -> Any:
    """Hydra's override parser, built once (building it costs more than a parse)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


#: Overrides that say how a job was started, never which point it is (as
#: ``art_hydra.trackers.placement`` names runs): never swept keys or point labels.
NOT_A_POINT = ("resume", "dry_run")


def is_run_control(key: str) -> bool:
    """Whether an override key only says how a job was started (``resume``, ``dry_run``,
    ``hydra.*``): a resumed sweep's jobs carry ``resume=auto``, not another point."""
    key = key.strip().lstrip("+~")
    return key in NOT_A_POINT or key == "hydra" or key.startswith(("hydra.", "hydra/"))


def parse_overrides(overrides: list[str]) -> dict[str, Any]:
    """``key -> value`` of a job's overrides, as Hydra's override parser reads each
    value (``+``/``~`` prefixes off the key; an override the parser refuses, such as a
    redacted ``***``, kept as its text); run-control overrides (:func:`is_run_control`)
    left out."""
    parser = _parser()
    out: dict[str, Any] = {}
    for text in overrides:
        key, _, raw = text.partition("=")
        if is_run_control(key):
            continue
        try:
            parsed = parser.parse_override(text)
            out[parsed.get_key_element().lstrip("+~")] = parsed.value()
        except Exception:  # the parser's grammar errors: the text is what there is
            out[key.lstrip("+~")] = raw
    return out


def _same(value: Any) -> str:
    """A value as a comparable key (dicts and lists are not hashable)."""
    return json.dumps(value, sort_keys=True, default=str)


def swept_keys(points: list[dict[str, Any]], declared: list[str]) -> list[str]:
    """The keys that tell points apart: those the sweep declared swept (its
    ``multirun.yaml``) and any whose value differs between jobs, in command-line order."""
    order: dict[str, None] = {}
    for point in points:
        order.update(dict.fromkeys(point))
    varying = {
        key
        for key in order
        if len({_same(p.get(key, "<unset>")) for p in points}) > 1 or key in declared
    }
    return [k for k in order if k in varying and not is_run_control(k)]


def cell(value: Any) -> Any:
    """A parsed value as a CSV cell: numbers and strings as they are, bools as
    ``true``/``false`` (Hydra's spelling), lists and dicts as JSON."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return value
    return json.dumps(value, default=str)


def declared_swept(multirun: Any) -> list[str]:
    """The keys a sweep's ``multirun.yaml`` sweeps: its sweep overrides (``a=1,2``,
    ``choice``, ``range``, ``interval``) and the sweeper's ``params``."""
    from omegaconf import OmegaConf

    if multirun is None:
        return []
    task = [str(o) for o in OmegaConf.select(multirun, "hydra.overrides.task", default=[]) or []]
    keys: list[str] = []
    parser = _parser()
    for text in task:
        try:
            parsed = parser.parse_override(text)
        except Exception:
            continue
        if parsed.is_sweep_override():
            keys.append(parsed.get_key_element().lstrip("+~"))
    params = OmegaConf.select(multirun, "hydra.sweeper.params", default=None)
    if params is not None:
        keys += [str(k) for k in OmegaConf.to_container(params, resolve=False) or {}]
    return list(dict.fromkeys(keys))


# ---- metrics --------------------------------------------------------------------------


def read_rows(folder: Path) -> list[dict[str, Any]]:
    """A job's metrics.jsonl lines (bounded, never through a link; torn lines skipped)."""
    from art_hydra.runs.run_folder import entry_kind, open_record

    path = folder / run_files.METRICS
    if entry_kind(path) != "file":
        return []
    try:
        fd = open_record(path, os.O_RDONLY)
    except OSError:
        return []
    with os.fdopen(fd, "rb") as handle:
        data = handle.read(METRICS_MAX_BYTES)
    rows = []
    for line in data.decode(errors="replace").splitlines():
        try:
            row = safe_json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def final_metrics(final: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, float]:
    """Every metric's last value: the last metrics line (result.json's ``final``), and
    for a metric missing there (``eval/*`` logged at an earlier evaluation step) its
    last logged value."""
    out = {k: v for k, v in final.items() if k not in _NOT_METRICS and _finite(v)}
    for row in reversed(rows):
        for key, value in row.items():
            if key not in _NOT_METRICS and key not in out and _finite(value):
                out[key] = value
    return out


def metric_order(names: set[str]) -> list[str]:
    """Metric columns: the step metrics in their usual order, then the rest by name
    (``eval/*``, ``reward/<name>/*``, ``sampling_mismatch_*``)."""
    first = [m for m in STEP_METRICS if m in names]
    return first + sorted(names - set(first))


# ---- aggregation over seeds ---------------------------------------------------------


@dataclass
class Point:
    """The jobs of one point (same swept values, seed aside), aggregated."""

    values: dict[str, Any]
    jobs: list[Any] = field(default_factory=list)

    def label(self) -> str:
        return " ".join(f"{k}={cell(v)}" for k, v in self.values.items()) or "(one point)"

    def stats(self, name: str) -> tuple[float | None, float | None, int]:
        """Mean, std (sample; None for one job) and n of ``name`` over the point's jobs
        (``objective``, or a final metric)."""
        numbers = [v for j in self.jobs if _finite(v := _value(j, name))]
        if not numbers:
            return None, None, 0
        std = statistics.stdev(numbers) if len(numbers) > 1 else None
        return statistics.fmean(numbers), std, len(numbers)


def _value(job: Any, name: str) -> Any:
    return job.objective if name == "objective" else job.metrics.get(name)


def group_points(jobs: list[Any], keys: list[str], maximize: bool) -> list[Point]:
    """Ranked jobs grouped by their swept values without the seed, best mean first."""
    grouped: dict[str, Point] = {}
    kept = [k for k in keys if k != SEED_KEY]
    for job in jobs:
        values = {k: job.params.get(k) for k in kept}
        grouped.setdefault(_same(values), Point(values)).jobs.append(job)

    def order(point: Point) -> float:
        mean = point.stats("objective")[0]
        return -math.inf if mean is None else (mean if maximize else -mean)

    return sorted(grouped.values(), key=order, reverse=True)


def grouped_metrics(jobs: list[Any]) -> list[str]:
    """The metrics aggregated beside the objective: the main ones and each evaluation's
    reward and loss, when any job logged them."""
    names = {m for j in jobs for m in j.metrics}
    evals = sorted(
        m for m in names if m.startswith("eval/") and m.endswith(("reward_mean", "loss"))
    )
    return [m for m in MAIN_METRICS if m in names] + evals
