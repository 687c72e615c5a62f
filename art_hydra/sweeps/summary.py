"""A sweep's summary: which point won, which failed and why, which never finished.

Every job of a sweep leaves ``result.json`` in its folder (:mod:`art_hydra.engine.result`);
:func:`summarize` reads them all (and the sweep's ``multirun.yaml``, for how many
points were planned), ranks the finished jobs by their objective (in the direction
their record names) and :func:`finish_sweep` writes ``summary.csv`` (a column per
swept key and per final metric, :mod:`art_hydra.sweeps.summary_table`),
``summary_grouped.csv`` (the points over seeds), ``summary.md`` and ``summary.png``
(:mod:`art_hydra.sweeps.summary_plot`) into the sweep folder, atomically: a person
compares points by these, not by one job's line. ``art-hydra summarize SWEEP_DIR``
does the same from the command line, for any sweep folder, finished or not (or each
sweep folder below a parent, apart): a job whose record still says ``running`` while
nobody holds its folder's lock was killed (SIGKILL, the OOM killer, a lost node).

Plain Python (no torch): it runs in the sweep's parent process and from the command
line in a fraction of a second.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_hydra import safe_json
from art_hydra.config import run_files
from art_hydra.sweeps import summary_table as table

#: What a job folder's state is read as (result.json's status, or what its absence says).
KILLED = "killed"
NO_RECORD = "no record"
#: How deep below the sweep folder job folders are looked for (``<sweep>/<job>`` is 1).
MAX_DEPTH = 3
#: Job folders read (one past it is looked for, to tell that the limit was met).
MAX_JOBS = 100_000
#: Top points printed.
TOP = 5
#: Metrics shown beside the objective, when logged.
KEY_METRICS = ("reward_mean", "loss")
#: Folders of a job's own record, never job folders themselves.
_NOT_JOBS = frozenset(
    {run_files.TENSORBOARD, run_files.TRACKERS, run_files.HYDRA_RECORD, ".submitit", "checkpoints"}
)
#: Where a study records the trials it refused without a job folder
#: (``<sweep>/refused/<k>/result.json``): refused points, not jobs.
REFUSED_DIR = "refused"
#: How deep below a parent folder sweep folders are looked for
#: (``outputs/multirun/<date>/<time>`` is 3).
MAX_SWEEP_DEPTH = 4
#: Sweep folders summarised below one parent folder.
MAX_SWEEPS = 1_000


@dataclass
class Job:
    """One job folder as its record describes it."""

    folder: Path
    status: str
    job_num: int | None = None
    reason: str | None = None
    overrides: list[str] = field(default_factory=list)
    objective: float | None = None
    metric: str | None = None
    direction: str | None = None
    final: dict[str, Any] = field(default_factory=dict)
    windowed: dict[str, Any] = field(default_factory=dict)
    steps: int | None = None
    max_steps: int | None = None
    wall_time_s: float | None = None
    rank: int | None = None
    #: Its objective is another metric or direction than the one the sweep is ranked by.
    other_objective: bool = False
    #: Its overrides as Hydra parses their values (``key -> int | float | bool | str``).
    params: dict[str, Any] = field(default_factory=dict)
    #: Every metric's last logged value (result.json's ``final``, ``eval/*`` from
    #: metrics.jsonl when logged earlier).
    metrics: dict[str, float] = field(default_factory=dict)
    #: ``(step, value)`` of the curve the plot draws (the ranked metric).
    curve: list[tuple[int, float | None]] = field(default_factory=list)
    #: Its swept values, seed included, as the plot and tables name the job.
    point_label: str = ""
    #: A name instead of ``#<num>`` (``refused/<k>``: a refused trial without a job).
    name: str | None = None

    @property
    def label(self) -> str:
        if self.name is not None:
            return self.name
        return f"#{self.job_num}" if self.job_num is not None else self.folder.name

    @property
    def scored(self) -> bool:
        return self.status == "done" and self.objective is not None

    @property
    def ranked(self) -> bool:
        return self.scored and not self.other_objective


@dataclass
class Summary:
    """Every job of a sweep, ranked jobs first (best first), then the rest by number."""

    sweep_dir: Path
    jobs: list[Job]
    #: Points the sweep planned (from multirun.yaml), when that can be told.
    planned: int | None = None
    #: Finished jobs left out of the ranking: their objective is another one.
    unranked: list[Job] = field(default_factory=list)
    #: What of the sweep's records was not read, and why (a record refused, a cap met).
    notes: list[str] = field(default_factory=list)
    #: Trials a study refused without giving them a job folder (``refused/<k>``).
    refused_points: list[Job] = field(default_factory=list)
    #: The keys that tell its points apart, in command-line order.
    swept: list[str] = field(default_factory=list)
    #: The ranked jobs grouped by their swept values without the seed, best mean first.
    points: list[table.Point] = field(default_factory=list)
    #: The sweep's ``--config-name``/``--config-dir``, which its rerun command repeats.
    config_args: list[str] = field(default_factory=list)

    def unranked_line(self) -> str | None:
        """Jobs whose objective cannot be compared with the ranking's (RL and SFT jobs
        with ``objective.metric=auto``: reward_mean against loss)."""
        if not self.unranked:
            return None
        head = next((j for j in self.jobs if j.ranked), None)
        others = sorted({f"{j.metric} ({j.direction})" for j in self.unranked})
        labels = ", ".join(j.label for j in self.unranked)
        ranked_by = f"{head.metric} ({head.direction})" if head else "another objective"
        return (
            f"Not ranked: {labels} optimise {' and '.join(others)}, not {ranked_by}; set "
            "objective.metric (and objective.direction) for the whole sweep to compare them."
        )

    def count(self, *statuses: str) -> int:
        return sum(1 for j in self.jobs if j.status in statuses)

    @property
    def never_started(self) -> int:
        """Planned points with no folder at all (a sweep stopped early); a study's
        refused trials without a folder are not among them."""
        return max(0, self.planned - len(self.jobs)) if self.planned is not None else 0

    @property
    def best(self) -> Job | None:
        return self.jobs[0] if self.jobs and self.jobs[0].ranked else None

    def counts_line(self) -> str:
        """``N done / M failed (#i: reason) / K refused / R running / X killed or never
        finished`` (interrupted jobs, when any, have their own count)."""
        failed = [j for j in self.jobs if j.status == "failed"]
        grouped: dict[str, list[str]] = {}
        for job in failed:  # one entry per reason, naming every job it stopped
            grouped.setdefault(_first_line(job.reason), []).append(job.label)
        shown = list(grouped.items())
        reasons = "; ".join(f"{', '.join(labels)}: {why}" for why, labels in shown[:5])
        if len(shown) > 5:
            reasons += f"; and {len(shown) - 5} more reasons"
        refused = self.count("refused") + len(self.refused_points)
        trials = len(self.refused_points)
        parts = [
            f"{self.count('done')} done",
            f"{len(failed)} failed" + (f" ({reasons})" if failed else ""),
            f"{refused} refused"
            + (f" ({trials} trial(s) without a job, in {REFUSED_DIR}/)" if trials else ""),
        ]
        interrupted = self.count("interrupted")
        if interrupted:
            parts.append(f"{interrupted} interrupted")
        parts.append(f"{self.count('running')} running")
        lost = self.count(KILLED, NO_RECORD) + self.never_started
        parts.append(f"{lost} killed or never finished")
        return " / ".join(parts)

    def best_line(self) -> str | None:
        """``Best: #N (metric = value) in FOLDER: art-hydra OVERRIDES``, each override
        shell-quoted: the command after the colon, pasted into bash, runs that job again
        (``{_target_:...,weight:1.0}`` is not brace-expanded)."""
        best = self.best
        if best is None:
            return None
        return (
            f"Best: {best.label} ({best.metric} = {_num(best.objective)}) in {best.folder}: "
            f"{rerun_command(best.overrides, self.config_args)}"
        )

    def text(self, top: int = TOP) -> str:
        """What a person reads at the end of a sweep: the top points and the counts."""
        lines = [f"Sweep {self.sweep_dir}: {len(self.jobs)} job folder(s)"]
        ranked = [j for j in self.jobs if j.ranked]
        if ranked:
            head = ranked[0]
            lines.append(
                f"Ranked by {head.metric} ({head.direction}); top {min(top, len(ranked))}:"
            )
            lines += _table(ranked[:top], markdown=False)
        else:
            lines.append("No finished job has an objective yet.")
        if any(len(p.jobs) > 1 for p in self.points):
            lines.append(f"Points over seeds (mean ± std, n); top {min(top, len(self.points))}:")
            lines += _points_table(self.points[:top], self._grouped_metrics(), markdown=False)
        lines.append(self.counts_line())
        if self.unranked_line():
            lines.append(self.unranked_line())
        unscored = [j.label for j in self.jobs if j.status == "done" and not j.scored]
        if unscored:
            lines.append(
                f"Done without an objective (no logged value of its metric): {', '.join(unscored)}"
            )
        lines += [f"Note: {note}" for note in self.notes]
        best_line = self.best_line()
        if best_line is not None:
            lines.append(best_line)
        return "\n".join(lines)

    def _grouped_metrics(self) -> list[str]:
        return table.grouped_metrics([j for j in self.jobs if j.ranked])

    def metric_names(self) -> list[str]:
        return table.metric_order({m for j in self.jobs for m in j.metrics})

    def csv_text(self) -> str:
        """Every job (and refused trial): its swept values as columns, every final
        metric, its status and folder."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        metrics = self.metric_names()
        writer.writerow(
            [
                "rank",
                "job",
                "status",
                "objective",
                "metric",
                "direction",
                *self.swept,
                *(f"final.{m}" for m in metrics),
                "steps",
                "max_steps",
                "wall_time_s",
                "overrides",
                "reason",
                "folder",
            ]
        )
        for j in [*self.jobs, *self.refused_points]:
            writer.writerow(
                [
                    j.rank or "",
                    j.label if j.name else ("" if j.job_num is None else j.job_num),
                    j.status,
                    "" if j.objective is None else repr(j.objective),
                    j.metric or "",
                    j.direction or "",
                    *(table.cell(j.params.get(k)) for k in self.swept),
                    *(_cell_value(j.metrics.get(m)) for m in metrics),
                    "" if j.steps is None else j.steps,
                    "" if j.max_steps is None else j.max_steps,
                    "" if j.wall_time_s is None else j.wall_time_s,
                    " ".join(j.overrides),
                    j.reason or "",
                    str(j.folder),
                ]
            )
        return out.getvalue()

    def grouped_csv_text(self) -> str:
        """One row per point (swept values, seed aside): n, the seeds, and mean and std
        of the objective and the main metrics over its jobs."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        keys = [k for k in self.swept if k != table.SEED_KEY]
        names = ["objective", *self._grouped_metrics()]
        writer.writerow(
            [*keys, "n", "seeds", *(f"{n}_{s}" for n in names for s in ("mean", "std"))]
        )
        for point in self.points:
            stats = [point.stats(n) for n in names]
            seeds = " ".join(
                sorted(str(table.cell(j.params.get(table.SEED_KEY))) for j in point.jobs)
            )
            writer.writerow(
                [
                    *(table.cell(point.values.get(k)) for k in keys),
                    len(point.jobs),
                    seeds,
                    *(_cell_value(v) for mean, std, _ in stats for v in (mean, std)),
                ]
            )
        return out.getvalue()

    def markdown(self, plot: str | None = None) -> str:
        """summary.md: the counts, the best job and its command, the points over
        seeds, every job, the plot (``plot``: its file name) and why jobs stopped."""
        lines = [f"# Sweep summary: {self.sweep_dir}", "", self.counts_line(), ""]
        lines += [f"Note: {_md(note)}\n" for note in self.notes]
        if self.unranked_line():
            lines += [str(self.unranked_line()), ""]
        best = self.best
        if best is not None:
            lines += [
                f"**Best:** {best.label}: {best.metric} = {_num(best.objective)} "
                f"({best.direction}), in `{best.folder}`. Run it again:",
                "",
                "```bash",
                rerun_command(best.overrides, self.config_args),
                "```",
                "",
            ]
        if self.points:
            lines += ["## Points (aggregated over seeds: mean ± std, n)", ""]
            lines += _points_table(self.points, self._grouped_metrics(), markdown=True)
            lines.append("")
        lines += ["## Jobs", ""]
        lines += _jobs_md(self)
        if plot:
            lines += ["", f"![objective per point and reward curves of the top jobs]({plot})"]
        troubled = [
            j for j in [*self.jobs, *self.refused_points] if j.reason and j.status != "done"
        ]
        if troubled:
            lines += ["", "## Why jobs did not finish", ""]
            for j in troubled:
                lines.append(f"- {j.label} ({j.status}): {_md(_first_line(j.reason, 300))}")
        return "\n".join(lines) + "\n"


def rerun_command(overrides: list[str], config_args: list[str] | None = None) -> str:
    """``art-hydra``, the sweep's config choice (``--config-name``, ``--config-dir``) and
    the job's overrides, each shell-quoted: pasted into bash it runs that one job again
    (Hydra parses each word as the job got it); ``resume``/``dry_run``, which said how
    the sweep's job started, left out (the job runs afresh)."""
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in table.NOT_A_POINT]
    words = [*(config_args or []), *kept]
    return " ".join(["art-hydra", *(shlex.quote(o) for o in words)])


def config_args(multirun: Any) -> list[str]:
    """The sweep's primary config and added config folder as command-line options (a
    sweep of ``--config-name my_exp`` reruns with it, not the default config)."""
    from omegaconf import OmegaConf

    if multirun is None:
        return []
    args: list[str] = []
    name = OmegaConf.select(multirun, "hydra.job.config_name", default=None)
    if isinstance(name, str) and name and name != "config":
        args += ["--config-name", name]
    sources = OmegaConf.select(multirun, "hydra.runtime.config_sources", default=None) or []
    for source in sources:
        if not hasattr(source, "get") or source.get("provider") != "command-line":
            continue
        if source.get("schema") == "file" and isinstance(source.get("path"), str):
            args += ["--config-dir", source.get("path")]
    return args


def _stat_cell(stats: tuple[float | None, float | None, int]) -> str:
    mean, std, _ = stats
    if mean is None:
        return ""
    return _num(mean) if std is None else f"{_num(mean)} ± {_num(std)}"


def _points_table(points: list[table.Point], metrics: list[str], markdown: bool) -> list[str]:
    """The points over seeds: swept values, n, objective and main metrics (mean ± std)."""
    header = ["point", "n", "objective", *metrics]
    rows = [
        [p.label(), str(len(p.jobs)), *(_stat_cell(p.stats(n)) for n in ["objective", *metrics])]
        for p in points
    ]
    return _render(header, rows, markdown)


def _jobs_md(summary: Summary) -> list[str]:
    """Every job: rank, label, status, objective, its swept values and main metrics."""
    shown = [m for m in KEY_METRICS if any(m in j.metrics for j in summary.jobs)]
    evals = [m for m in summary._grouped_metrics() if m.startswith("eval/")]
    header = ["rank", "job", "status", "objective", *summary.swept, *shown, *evals, "steps"]
    rows = [
        [
            str(j.rank or ""),
            j.label,
            j.status,
            _num(j.objective),
            *(str(table.cell(j.params.get(k))) for k in summary.swept),
            *(_num(j.metrics.get(m)) for m in [*shown, *evals]),
            f"{_num(j.steps)}/{_num(j.max_steps)}" if j.max_steps else _num(j.steps),
        ]
        for j in summary.jobs
    ]
    return _render(header, rows, markdown=True)


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def _cell_value(value: Any) -> Any:
    return "" if value is None else value


def _md(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_line(text: str | None, limit: int = 120) -> str:
    lines = (text or "").strip().splitlines()
    line = lines[0] if lines else "no reason recorded"
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _varying(jobs: list[Job]) -> set[str]:
    """Overrides that not every job shares (a sweep's fixed overrides are noise in a
    table comparing its points)."""
    if len(jobs) < 2:
        return {o for j in jobs for o in j.overrides}
    shared = set.intersection(*(set(j.overrides) for j in jobs))
    return {o for j in jobs for o in j.overrides} - shared


def _table(jobs: list[Job], markdown: bool) -> list[str]:
    shown = [m for m in KEY_METRICS if any(m in j.metrics for j in jobs)]
    varying = _varying(jobs)
    header = ["rank", "job", "status", "objective", *shown, "steps", "overrides (varying)"]
    rows = [
        [
            str(j.rank or ""),
            j.label,
            j.status,
            _num(j.objective),
            *(_num(j.metrics.get(m)) for m in shown),
            f"{_num(j.steps)}/{_num(j.max_steps)}" if j.max_steps else _num(j.steps),
            " ".join(o for o in j.overrides if o in varying),
        ]
        for j in jobs
    ]
    return _render(header, rows, markdown)


def _render(header: list[str], rows: list[list[str]], markdown: bool) -> list[str]:
    """A table as Markdown, or as aligned text for a terminal."""
    if markdown:
        cells = [[_md(c) for c in row] for row in rows]
        return [
            "| " + " | ".join(header) + " |",
            "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(row) + " |" for row in cells),
        ]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths[:-1]) + "  {}"
    return ["  " + fmt.format(*header), *("  " + fmt.format(*row) for row in rows)]


# ---- reading the sweep folder --------------------------------------------------------


def _is_job_folder(folder: Path) -> bool:
    try:
        names = os.listdir(folder)
    except OSError:
        return False
    marks = {run_files.RESULT, run_files.HYDRA_RECORD, run_files.METRICS, run_files.RUN_CONFIG}
    return any(
        n in marks or n.startswith(run_files.PENDING_PREFIX) or n.endswith(".log") for n in names
    )


def job_folders(sweep_dir: Path) -> list[Path]:
    """The job folders below ``sweep_dir`` (``sweep_dir`` itself when its jobs write
    there, ``hydra.sweep.subdir=''``); links are never followed."""
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        if _is_job_folder(folder):
            found.append(folder)
            if folder != sweep_dir:
                return
        if depth >= MAX_DEPTH:
            return
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if entry.name.startswith(".") or entry.name in _NOT_JOBS:
                continue
            if depth == 0 and entry.name == REFUSED_DIR and not _is_job_folder(Path(entry.path)):
                continue  # a study's refused trials: points, read by refused_trials
            if len(found) > MAX_JOBS:
                return  # one past the limit: the summary says it stopped there
            if entry.is_dir(follow_symlinks=False):
                visit(Path(entry.path), depth + 1)

    visit(sweep_dir, 0)
    return found


def _lock_held(folder: Path) -> bool:
    from art_hydra.runs.run_folder import lock_holder

    return lock_holder(folder) is not None


def _number(value: Any) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


#: The statuses a job's record may hold (anything else counts as no usable record).
STATUSES = ("running", "done", "failed", "interrupted", "refused")

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _printable(value: Any) -> Any:
    """A record with every control character (terminal escapes, bells) replaced: its text
    is printed to a terminal and written into summary files."""
    if isinstance(value, str):
        return _CONTROL.sub("?", value)
    if isinstance(value, dict):
        return {_printable(str(k)): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def read_job(folder: Path) -> Job:
    """One job folder: its result.json (a ``running`` record whose folder lock nobody
    holds is a killed job), or what its absence says."""
    path = folder / run_files.RESULT
    if not path.exists():
        status = "running" if _lock_held(folder) else NO_RECORD
        reason = None if status == "running" else "no result.json: killed before it ended"
        return Job(folder, status, _folder_number(folder), reason)
    if path.is_symlink():
        reason = "result.json is a symbolic link: not read (a job writes a regular file)"
        return Job(folder, NO_RECORD, _folder_number(folder), reason)
    try:
        record = safe_json.read(path, max_bytes=4 << 20)
    except ValueError as exc:
        return Job(folder, NO_RECORD, _folder_number(folder), f"unreadable result.json: {exc}")
    if not isinstance(record, dict):
        return Job(folder, NO_RECORD, _folder_number(folder), "result.json holds no record")
    record = _printable(record)
    objective = record.get("objective") if isinstance(record.get("objective"), dict) else {}
    status = str(record.get("status", NO_RECORD))
    if status not in STATUSES:
        return Job(folder, NO_RECORD, _folder_number(folder), f"unknown status {status!r}")
    reason = record.get("reason") if isinstance(record.get("reason"), str) else None
    if status == "running" and not _lock_held(folder):
        status = KILLED
        reason = (
            f"its process (pid {record.get('pid')} on {record.get('host')}) ended without "
            "writing its result: killed (SIGKILL, out of memory) or its node was lost"
        )
    overrides = record.get("overrides")
    job_num = _int(record.get("job_num"))
    return Job(
        folder=folder,
        status=status,
        job_num=job_num if job_num is not None else _folder_number(folder),
        reason=reason,
        overrides=[str(o) for o in overrides] if isinstance(overrides, list) else [],
        objective=_number(objective.get("value")),
        metric=objective.get("metric") if isinstance(objective.get("metric"), str) else None,
        direction=objective.get("direction")
        if objective.get("direction") in ("maximize", "minimize")
        else None,
        final=record.get("final") if isinstance(record.get("final"), dict) else {},
        windowed=record.get("windowed") if isinstance(record.get("windowed"), dict) else {},
        steps=_int(record.get("steps")),
        max_steps=_int(record.get("max_steps")),
        wall_time_s=_number(record.get("wall_time_s")),
    )


def _folder_number(folder: Path) -> int | None:
    return int(folder.name) if folder.name.isdigit() else None


#: Points a sweep's record may describe: real sweeps have at most thousands, and a
#: record that says ``seed=range(0,20000000)`` is not expanded to find out.
MAX_POINTS = 100_000


class SweepTooLarge(ValueError):
    """A sweep record whose overrides expand past :data:`MAX_POINTS` (or never end)."""


def planned_points(sweep_dir: Path) -> int | None:
    """How many points the sweep planned, from its ``multirun.yaml``: an optimising
    sweeper's ``n_trials``, or the grid's size; None when that cannot be told."""
    return _planned(sweep_dir)[0]


def _planned(sweep_dir: Path) -> tuple[int | None, str | None]:
    """:func:`planned_points`, and why it cannot be told when the record is refused: it
    is read within bounds (size, nesting, YAML aliases) and its grid is counted without
    being expanded (at most :data:`MAX_POINTS` points)."""
    from omegaconf import OmegaConf

    from art_hydra.config.yaml_guard import YamlRefused, load_bounded

    path = sweep_dir / "multirun.yaml"
    if not path.is_file():
        return None, None
    try:
        cfg = load_bounded(path)
        sweeper = OmegaConf.select(cfg, "hydra.sweeper", default=None)
        trials = OmegaConf.select(sweeper, "n_trials", default=None) if sweeper else None
        overrides = [
            str(o) for o in OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or []
        ]
        if isinstance(trials, int) and not isinstance(trials, bool):
            return _study_size(sweeper, trials, overrides, path), None
        return grid_size(overrides, path), None
    except (YamlRefused, SweepTooLarge) as exc:
        return None, f"planned points unknown: {exc}"
    except Exception:  # a torn or foreign record: the count is only left out
        return None, None


def _study_size(sweeper: Any, trials: int, overrides: list[str], path: Path) -> int:
    """A study's trials: ``n_trials``, but no more than its grid where the sampler is
    Optuna's GridSampler (Hydra's Optuna sweeper caps ``n_trials`` at the grid's size)."""
    from omegaconf import OmegaConf

    sampler = str(OmegaConf.select(sweeper, "sampler._target_", default="") or "")
    if not sampler.endswith("GridSampler"):
        return trials
    params = OmegaConf.select(sweeper, "params", default=None) or {}
    space = [f"{key}={value}" for key, value in dict(params).items()]
    size = grid_size([*space, *overrides], path)
    return trials if size is None else min(trials, size)


def grid_size(overrides: list[str], source: Path | str) -> int | None:
    """The number of points of a grid of ``overrides`` (None: an interval, which only an
    optimising sweeper samples), counted without expanding them. ``source`` names the
    record in the :class:`SweepTooLarge` raised past :data:`MAX_POINTS`."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ChoiceSweep, RangeSweep

    size = 1
    for text, override in zip(
        overrides, OverridesParser.create().parse_overrides(overrides), strict=True
    ):
        if not override.is_sweep_override():
            continue
        value = override.value()
        if isinstance(value, RangeSweep):
            size *= _range_size(override, text, source)
        elif isinstance(value, ChoiceSweep):
            size *= len(value.list)
        else:
            return None  # an interval: only an optimising sweeper samples it
        if size > MAX_POINTS:
            raise SweepTooLarge(
                f"{source}: the overrides up to {text!r} make more than {MAX_POINTS:,} sweep "
                f"points (art_hydra's limit for a sweep record); it is not expanded"
            )
    return size


def _range_size(override: Any, text: str, source: Path | str) -> int:
    """The points of ``range(start, stop, step)``, counted arithmetically before Hydra
    steps through it; a step of 0 (a range that never ends) or more than
    :data:`MAX_POINTS` points is refused."""
    value = override.value()
    start, stop, step = value.start, value.stop, value.step
    numbers = all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        for v in (start, stop, step)
    )
    if not numbers or step == 0:
        raise SweepTooLarge(f"{source}: the override {text!r} is a range that never ends")
    estimate = max(0, math.ceil((stop - start) / step))
    if estimate > MAX_POINTS:
        raise SweepTooLarge(
            f"{source}: the override {text!r} makes {estimate:,} sweep points, more than "
            f"{MAX_POINTS:,} (art_hydra's limit for a sweep record); it is not expanded"
        )
    if all(isinstance(v, int) for v in (start, stop, step)):
        return estimate
    return len(list(override.sweep_iterator()))  # floats: Hydra's own stepping, bounded


def summarize(sweep_dir: str | Path) -> Summary:
    """Read every job folder of ``sweep_dir`` and rank the finished ones by their
    objective (best first, in the direction their records name); the study's refused
    trials without a job (``refused/<k>``) are counted apart."""
    root = Path(sweep_dir)
    folders = job_folders(root)
    notes = []
    if len(folders) > MAX_JOBS:
        notes.append(
            f"{root} holds more than {MAX_JOBS:,} job folders (art_hydra's limit for a "
            f"sweep); only the first {MAX_JOBS:,} were read"
        )
    jobs = [read_job(folder) for folder in folders[:MAX_JOBS]]
    scored = [j for j in jobs if j.scored]
    kinds: dict[tuple[Any, Any], int] = {}
    for job in scored:  # the objective most jobs have; ties: the first job's
        kinds[(job.metric, job.direction)] = kinds.get((job.metric, job.direction), 0) + 1
    chosen = max(kinds, key=lambda k: kinds[k]) if kinds else None
    for job in scored:
        job.other_objective = (job.metric, job.direction) != chosen
    ranked = [j for j in scored if j.ranked]
    maximize = chosen is None or chosen[1] != "minimize"
    ranked.sort(
        key=lambda j: (-(j.objective or 0.0) if maximize else (j.objective or 0.0), _order(j))
    )
    for rank, job in enumerate(ranked, 1):
        job.rank = rank
    rest = sorted((j for j in jobs if not j.ranked), key=_order)
    unranked = [j for j in rest if j.other_objective]
    planned, why = _planned(root)
    notes += [why] if why else []
    summary = Summary(root, [*ranked, *rest], planned, unranked, notes, refused_trials(root))
    _compare(summary, chosen[0] if chosen else None, maximize)
    return summary


def _compare(summary: Summary, metric: str | None, maximize: bool) -> None:
    """What the tables compare by: each job's parsed swept values, final metrics and
    curve, and the ranked jobs grouped over seeds."""
    everyone = [*summary.jobs, *summary.refused_points]
    for job in everyone:
        job.params = table.parse_overrides(job.overrides)
    multirun = _multirun(summary.sweep_dir)
    summary.swept = table.swept_keys([j.params for j in everyone], table.declared_swept(multirun))
    summary.config_args = config_args(multirun)
    curve_key = metric or "reward_mean"
    for job in summary.jobs:
        rows = table.read_rows(job.folder) if job.status != "refused" else []
        job.metrics = table.final_metrics(job.final, rows)
        job.curve = [(r["step"], _number(r.get(curve_key))) for r in rows]
        job.point_label = " ".join(
            f"{k}={table.cell(job.params[k])}" for k in summary.swept if k in job.params
        )
    summary.points = table.group_points(
        [j for j in summary.jobs if j.ranked], summary.swept, maximize
    )


def _multirun(sweep_dir: Path) -> Any:
    """The sweep's ``multirun.yaml`` (bounded), or None."""
    from art_hydra.config.yaml_guard import load_bounded

    path = sweep_dir / run_files.SWEEP_FILES[0]
    if not path.is_file() or path.is_symlink():
        return None
    try:
        return load_bounded(path)
    except Exception:  # a torn or foreign record: the swept keys come from the jobs
        return None


def refused_trials(sweep_dir: Path) -> list[Job]:
    """The trials a study refused without a job folder, each recorded as
    ``<sweep>/refused/<k>/result.json`` (the record a refused point's folder holds)."""
    root = sweep_dir / REFUSED_DIR
    if root.is_symlink() or not root.is_dir():
        return []
    try:
        names = sorted(
            os.listdir(root), key=lambda n: (not n.isdigit(), int(n) if n.isdigit() else 0, n)
        )
    except OSError:
        return []
    found = []
    for name in names[:MAX_JOBS]:
        folder = root / name
        if name.startswith(".") or folder.is_symlink() or not folder.is_dir():
            continue
        job = read_job(folder)
        job.name = f"{REFUSED_DIR}/{name}"
        found.append(job)
    return found


def _order(job: Job) -> tuple[int, str]:
    return (job.job_num if job.job_num is not None else 1 << 30, str(job.folder))


def write_summary(summary: Summary) -> tuple[Path, Path]:
    """Write ``summary.csv``, ``summary_grouped.csv``, ``summary.md`` and the plot
    ``summary.png`` into the sweep folder (temp file, then rename, never through a
    link). A plot that cannot be drawn is named in summary.md, never fatal."""
    from art_hydra.runs.run_folder import write_atomic

    csv_name, md_name, grouped_name, plot_name = run_files.SWEEP_SUMMARY
    csv_path, md_path = summary.sweep_dir / csv_name, summary.sweep_dir / md_name
    write_atomic(csv_path, summary.csv_text())
    write_atomic(summary.sweep_dir / grouped_name, summary.grouped_csv_text())
    plot: str | None = None
    if summary.points:
        try:
            _draw(summary, summary.sweep_dir / plot_name)
            plot = plot_name
        except Exception as exc:  # matplotlib missing or broken: the tables still stand
            summary.notes.append(f"the plot could not be drawn ({type(exc).__name__}: {exc})")
    write_atomic(md_path, summary.markdown(plot))
    return csv_path, md_path


def _draw(summary: Summary, path: Path) -> Path:
    from art_hydra.sweeps.summary_plot import write_plot

    ranked = [j for j in summary.jobs if j.ranked]
    metric = ranked[0].metric or "objective"
    return write_plot(path, summary.points, ranked, metric, metric)


def finish_sweep(sweep_dir: str | Path) -> str:
    """Summarise ``sweep_dir``, write its summary files and return the text to print
    (the top points, the counts line and where the files are). Never raises for a sweep
    that launched nothing (no folder) or a summary that cannot be written."""
    summary = summarize(sweep_dir)
    if not summary.jobs and not summary.refused_points:
        return f"Sweep {summary.sweep_dir}: no job folder (nothing was launched); no summary."
    try:
        csv_path, md_path = write_summary(summary)
    except OSError as exc:  # a full disk: the text still tells the outcome
        return f"{summary.text()}\nThe summary files could not be written: {exc}"
    return f"{summary.text()}\n{_written(csv_path, md_path)}"


def _written(csv_path: Path, md_path: Path) -> str:
    names = [n for n in run_files.SWEEP_SUMMARY[1:] if (csv_path.parent / n).is_file()]
    return f"Summary: {csv_path}, " + (" and ".join([", ".join(names[:-1]), names[-1]]))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def sweep_folders(parent: Path) -> list[Path]:
    """The sweep folders at or below ``parent`` (those holding Hydra's
    ``multirun.yaml``, up to :data:`MAX_SWEEP_DEPTH` levels down), sorted; a sweep
    folder's own job folders are not searched, links are never followed."""
    marker = run_files.SWEEP_FILES[0]
    found: list[Path] = []

    def visit(folder: Path, depth: int) -> None:
        if len(found) >= MAX_SWEEPS:
            return
        if (folder / marker).is_file():
            found.append(folder)
            return
        if depth >= MAX_SWEEP_DEPTH:
            return
        try:
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            if not entry.name.startswith(".") and entry.is_dir(follow_symlinks=False):
                visit(Path(entry.path), depth + 1)

    visit(parent, 0)
    return found


def _single_run(folder: Path) -> str:
    """What a single run's folder is, in words (``summarize`` writes nothing there)."""
    job = read_job(folder)
    objective = f"; {job.metric} = {_num(job.objective)}" if job.objective is not None else ""
    return (
        f"art-hydra summarize: {folder} is a single run's folder (status {job.status}"
        f"{objective}), not a sweep folder: a summary compares the jobs of a sweep, so "
        "nothing was written. Give the sweep folder (the one holding multirun.yaml, "
        "hydra.sweep.dir), or a folder above several sweeps.\n"
    )


def _summarize_sweeps(sweeps: list[Path], root: Path, top: int) -> int:
    """Summarise each sweep folder on its own (its jobs ranked only against each other)
    and write its summary files there."""
    if len(sweeps) > 1:
        print(f"{len(sweeps)} sweep folders below {root}; each is summarised on its own.")
    for sweep in sweeps:
        summary = summarize(sweep)
        if len(sweeps) > 1:
            print(f"\n=== {sweep} ===")
        if not summary.jobs and not summary.refused_points:
            print(f"Sweep {sweep}: no job folder (nothing was launched); no summary.")
            continue
        csv_path, md_path = write_summary(summary)
        print(summary.text(top))
        print(_written(csv_path, md_path))
    return 0


def main(argv: list[str] | None = None) -> int:
    """``art-hydra summarize SWEEP_DIR``: summarise a sweep folder, finished or not, or
    every sweep folder below a parent folder, each on its own."""
    parser = argparse.ArgumentParser(
        prog="art-hydra summarize",
        description=(
            "Rank a sweep's jobs by their objective (each job's result.json), print the top "
            "points, the points aggregated over seeds and the done / failed / refused / "
            "running / killed counts, and write summary.csv, summary_grouped.csv, "
            "summary.md and summary.png into the sweep folder. Works on a sweep that is "
            "still running or was stopped. Given a folder above several sweeps, each "
            "sweep folder (one holding multirun.yaml) is summarised on its own; a single "
            "run's folder is never written into."
        ),
    )
    parser.add_argument("sweep_dir", help="the sweep folder (hydra.sweep.dir), or a parent")
    parser.add_argument("--top", type=_positive, default=TOP, help="top points to print")
    args = parser.parse_args(argv)
    root = Path(args.sweep_dir)
    if not root.is_dir():
        sys.stderr.write(f"art-hydra summarize: {root} is not a folder\n")
        return 1
    sweeps = sweep_folders(root)
    if sweeps:
        return _summarize_sweeps(sweeps, root, args.top)
    if _is_job_folder(root):
        sys.stderr.write(_single_run(root))
        return 1
    summary = summarize(root)
    if not summary.jobs:
        sys.stderr.write(
            f"art-hydra summarize: {root} holds no sweep folder (no multirun.yaml within "
            f"{MAX_SWEEP_DEPTH} levels) and no job folder: is it a sweep folder "
            "(hydra.sweep.dir)?\n"
        )
        return 1
    print(summary.text(args.top))
    print(
        f"Not written: {root} holds job folders but no multirun.yaml, so it is not a "
        "sweep's folder (single runs, or copies); the summary above is printed only."
    )
    return 0
