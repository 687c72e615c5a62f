"""A sweep's summary: which point won, which failed and why, which never finished.

Every job of a sweep leaves ``result.json`` in its folder (:mod:`art_hydra.engine.result`);
:func:`summarize` reads them all (and the sweep's ``multirun.yaml``, for how many
points were planned), ranks the finished jobs by their objective (in the direction
their record names) and :func:`finish_sweep` writes ``summary.csv`` and
``summary.md`` into the sweep folder, atomically. ``art-hydra summarize SWEEP_DIR``
does the same from the command line, for any sweep folder, finished or not: a job
whose record still says ``running`` while nobody holds its folder's lock was killed
(SIGKILL, the OOM killer, a lost node).

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
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from art_hydra import safe_json
from art_hydra.config import run_files
from art_hydra.config.objective import STEP_METRICS

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
_NOT_JOBS = frozenset({run_files.TENSORBOARD, run_files.HYDRA_RECORD, ".submitit", "checkpoints"})


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

    @property
    def label(self) -> str:
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
        """Planned points with no folder at all (a sweep stopped early)."""
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
        parts = [
            f"{self.count('done')} done",
            f"{len(failed)} failed" + (f" ({reasons})" if failed else ""),
            f"{self.count('refused')} refused",
        ]
        interrupted = self.count("interrupted")
        if interrupted:
            parts.append(f"{interrupted} interrupted")
        parts.append(f"{self.count('running')} running")
        lost = self.count(KILLED, NO_RECORD) + self.never_started
        parts.append(f"{lost} killed or never finished")
        return " / ".join(parts)

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
        lines.append(self.counts_line())
        if self.unranked_line():
            lines.append(self.unranked_line())
        unscored = [j.label for j in self.jobs if j.status == "done" and not j.scored]
        if unscored:
            lines.append(
                f"Done without an objective (no logged value of its metric): {', '.join(unscored)}"
            )
        lines += [f"Note: {note}" for note in self.notes]
        best = self.best
        if best is not None:
            lines.append(
                f"Best: {best.label} {' '.join(best.overrides) or '(no overrides)'} "
                f"({best.metric} = {_num(best.objective)}) in {best.folder}"
            )
        return "\n".join(lines)

    def csv_text(self) -> str:
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        metrics = [m for m in STEP_METRICS if any(m in j.final for j in self.jobs)]
        writer.writerow(
            [
                "rank",
                "job",
                "status",
                "objective",
                "metric",
                "direction",
                "steps",
                "max_steps",
                "wall_time_s",
                "overrides",
                "reason",
                "folder",
                *(f"final.{m}" for m in metrics),
            ]
        )
        for j in self.jobs:
            writer.writerow(
                [
                    j.rank or "",
                    "" if j.job_num is None else j.job_num,
                    j.status,
                    "" if j.objective is None else repr(j.objective),
                    j.metric or "",
                    j.direction or "",
                    "" if j.steps is None else j.steps,
                    "" if j.max_steps is None else j.max_steps,
                    "" if j.wall_time_s is None else j.wall_time_s,
                    " ".join(j.overrides),
                    j.reason or "",
                    str(j.folder),
                    *(_cell_value(j.final.get(m)) for m in metrics),
                ]
            )
        return out.getvalue()

    def markdown(self) -> str:
        lines = [f"# Sweep summary: {self.sweep_dir}", "", self.counts_line(), ""]
        lines += [f"Note: {_md(note)}\n" for note in self.notes]
        if self.unranked_line():
            lines += [str(self.unranked_line()), ""]
        best = self.best
        if best is not None:
            lines += [
                f"**Best:** {best.label} `{' '.join(best.overrides)}`: "
                f"{best.metric} = {_num(best.objective)} ({best.direction})",
                "",
            ]
        lines += _table(self.jobs, markdown=True)
        troubled = [j for j in self.jobs if j.reason and j.status != "done"]
        if troubled:
            lines += ["", "## Why jobs did not finish", ""]
            for j in troubled:
                lines.append(f"- {j.label} ({j.status}): {_md(_first_line(j.reason, 300))}")
        return "\n".join(lines) + "\n"


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
    shown = [m for m in KEY_METRICS if any(m in j.final for j in jobs)]
    varying = _varying(jobs)
    header = ["rank", "job", "status", "objective", *shown, "steps", "overrides (varying)"]
    rows = [
        [
            str(j.rank or ""),
            j.label,
            j.status,
            _num(j.objective),
            *(_num(j.final.get(m)) for m in shown),
            f"{_num(j.steps)}/{_num(j.max_steps)}" if j.max_steps else _num(j.steps),
            " ".join(o for o in j.overrides if o in varying),
        ]
        for j in jobs
    ]
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
        if isinstance(trials, int) and not isinstance(trials, bool):
            return trials, None
        overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=[]) or []
        return grid_size([str(o) for o in overrides], path), None
    except (YamlRefused, SweepTooLarge) as exc:
        return None, f"planned points unknown: {exc}"
    except Exception:  # a torn or foreign record: the count is only left out
        return None, None


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
    objective (best first, in the direction their records name)."""
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
    return Summary(root, [*ranked, *rest], planned, unranked, notes)


def _order(job: Job) -> tuple[int, str]:
    return (job.job_num if job.job_num is not None else 1 << 30, str(job.folder))


def write_summary(summary: Summary) -> tuple[Path, Path]:
    """Write ``summary.csv`` and ``summary.md`` into the sweep folder (temp file, then
    rename, never through a link)."""
    from art_hydra.runs.run_folder import write_atomic

    csv_name, md_name = run_files.SWEEP_SUMMARY
    csv_path, md_path = summary.sweep_dir / csv_name, summary.sweep_dir / md_name
    write_atomic(csv_path, summary.csv_text())
    write_atomic(md_path, summary.markdown())
    return csv_path, md_path


def finish_sweep(sweep_dir: str | Path) -> str:
    """Summarise ``sweep_dir``, write its summary files and return the text to print
    (the top points, the counts line and where the files are). Never raises for a sweep
    that launched nothing (no folder) or a summary that cannot be written."""
    summary = summarize(sweep_dir)
    if not summary.jobs:
        return f"Sweep {summary.sweep_dir}: no job folder (nothing was launched); no summary."
    try:
        csv_path, md_path = write_summary(summary)
    except OSError as exc:  # a full disk: the text still tells the outcome
        return f"{summary.text()}\nThe summary files could not be written: {exc}"
    return f"{summary.text()}\nSummary: {csv_path} and {md_path.name}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def main(argv: list[str] | None = None) -> int:
    """``art-hydra summarize SWEEP_DIR``: summarise a sweep folder, finished or not."""
    parser = argparse.ArgumentParser(
        prog="art-hydra summarize",
        description=(
            "Rank a sweep's jobs by their objective (each job's result.json), print the top "
            "points and the done / failed / refused / running / killed counts, and write "
            "summary.csv and summary.md into the sweep folder. Works on a sweep that is "
            "still running or was stopped."
        ),
    )
    parser.add_argument("sweep_dir", help="the sweep folder (hydra.sweep.dir)")
    parser.add_argument("--top", type=_positive, default=TOP, help="top points to print")
    args = parser.parse_args(argv)
    root = Path(args.sweep_dir)
    if not root.is_dir():
        sys.stderr.write(f"art-hydra summarize: {root} is not a folder\n")
        return 1
    summary = summarize(root)
    if not summary.jobs:
        sys.stderr.write(
            f"art-hydra summarize: {root} holds no job folder (no result.json, .hydra or "
            "log within 3 levels): is it a sweep folder (hydra.sweep.dir)?\n"
        )
        return 1
    csv_path, md_path = write_summary(summary)
    print(summary.text(args.top))
    print(f"Summary: {csv_path} and {md_path.name}")
    return 0
