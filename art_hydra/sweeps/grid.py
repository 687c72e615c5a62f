"""A grid sweep checked whole before its first job starts, then launched point by point.

Hydra's basic sweeper composes each batch just before launching it and runs no
validators, so a bad point deep in a sweep is found after earlier jobs have run, or
never. The pre-flight sweeper (the plugin,
:mod:`hydra_plugins.art_hydra_preflight.preflight_sweeper`) expands the sweep the same way
(cartesian product of the overrides and ``hydra.sweeper.params``); here each point is
composed as its job will see it (its job number and output folder, so
``${hydra:job.num}`` is evaluated as in the job), checked, and given the world
pre-flight, all in the parent process. If any point cannot run, each is printed with its
overrides and problems and nothing is launched. With ``hydra.sweeper.skip_invalid=true``
the valid points are launched, each under its own number, and the skipped ones named.
Any launcher works (basic, joblib, submitit, ...).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra import moved
from art_hydra.config.problems import Problem, errors, warnings_of
from art_hydra.errors import full_error
from art_hydra.sweeps.points import ranks_per_job, record_refusal
from art_hydra.sweeps.reports import (
    fail,
    fail_if_unfinished,
    overrides_text,
    remote_failure,
    sweep_report,
    warning_report,
)

log = moved.logger(__name__)  # the name it logged under before the move


def preflight_points(
    checker: Any, config: DictConfig, points: list[list[str]]
) -> list[list[Problem]]:
    """Each point's problems, composed and checked as job number ``i`` will see it
    (:class:`~art_hydra.sweeps.preflight.PointChecker`: once per group selection)."""
    from art_hydra.config.launch_plan import planned_launch

    found: list[list[Problem]] = []
    refused = 0  # kept as it goes: recounting every point made a grid quadratic
    progress = _Progress(len(points))
    with planned_launch(ranks_per_job(config.hydra.launcher)):
        for index, point in enumerate(points):
            problems = checker.problems(point, index)
            found.append(problems)
            refused += bool(errors(problems))
            progress.step(refused)
    progress.done()
    return found


@dataclass
class GridSweep:
    """A grid whose every point was checked: refused whole, or its valid points launched
    (``skip_invalid``) under their own numbers, in batches of at most ``max_batch_size``."""

    config: DictConfig
    launcher: Any
    checker: Any
    points: list[list[str]]
    checked: list[list[Problem]]
    max_batch_size: int | None = None
    skip_invalid: bool = False

    def run(self) -> Any:
        """The sweep's launches (Hydra's sweeper returns them), or ``[]`` for a dry run."""
        points, checked = self.points, self.checked
        invalid = [i for i, problems in enumerate(checked) if errors(problems)]
        valid = [i for i in range(len(points)) if i not in invalid]
        warned = [(i, points[i], warnings_of(checked[i])) for i in valid if warnings_of(checked[i])]
        if warned:
            log.warning(warning_report(warned, len(points)))
        dry_run = bool(self.config.get("dry_run", False))
        if invalid:
            self._refuse_or_skip(invalid, valid, dry_run)
        if dry_run:
            lines = "\n".join(f"  ok #{i}: {overrides_text(points[i])}" for i in valid)
            print(
                f"dry run: pre-flight passed for {len(valid)} of {len(points)} sweep point(s); "
                f"nothing was launched.\n{lines}"
            )
            return []
        if not valid:
            return []
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = self._launch(valid)
        from art_hydra.sweeps.summary import finish_sweep

        sys.stdout.write(finish_sweep(sweep_dir).rstrip() + "\n")
        launches = getattr(self.launcher, "launches", None)
        fail_if_unfinished(launches.outcomes if launches is not None else {})
        return returns

    def _refuse_or_skip(self, invalid: list[int], valid: list[int], dry_run: bool) -> None:
        """Stop the sweep with its report; under ``skip_invalid`` (and some point valid),
        say which points are skipped instead, each one's folder recording why."""
        points, checked = self.points, self.checked
        report = sweep_report([(i, points[i], checked[i]) for i in invalid], len(points))
        if not self.skip_invalid:
            fail(
                f"{report}\nNo job was launched. Fix the points above, or add "
                "hydra.sweeper.skip_invalid=true to run the valid ones."
            )
        if not valid:
            fail(f"{report}\nNo point is valid; no job was launched.")
        if not dry_run:  # each skipped point's folder says why it never ran
            for i in invalid:
                folder = self.checker.run_dirs.get(i)
                if folder is not None:
                    record_refusal(folder, i, points[i], checked[i])
        verb = "would launch" if dry_run else "launching"
        log.warning(
            f"{report}\nSkipping these {len(invalid)} point(s); {verb} the {len(valid)} "
            "valid one(s) under their own numbers."
        )

    def _launch(self, valid: list[int]) -> list[Any]:
        """Launch the checked points in batches, each job under its point's number; every
        job runs, whatever another one did."""
        launches = getattr(self.launcher, "launches", None)
        returns = []
        for start, batch in self._batches(valid):
            try:
                if launches is not None:
                    done = launches.launch_checked([(start + k, p) for k, p in enumerate(batch)])
                    results = [done[start + k] for k in range(len(batch))]
                else:
                    results = self.launcher.launch(batch, initial_job_idx=start)
            except Exception as exc:
                # A job launched elsewhere (submitit) comes back as a trace in a string.
                remote = type(exc).__name__ in ("FailedJobError", "UncompletedJobError")
                if not remote or full_error():
                    raise
                fail(f"A job of the sweep stopped:\n{remote_failure(str(exc))}")
            returns.append(results)
        return returns

    def _batches(self, valid: list[int]) -> list[tuple[int, list[Any]]]:
        """Runs of consecutive point numbers, at most ``max_batch_size`` long: a launcher
        numbers a batch's jobs from its first index, so each job keeps its point's number
        (the one ``${hydra:job.num}`` was checked with)."""
        size = self.max_batch_size or len(self.points)
        batches: list[tuple[int, list[Any]]] = []
        for i in valid:
            last = batches[-1] if batches else None
            if last is not None and last[0] + len(last[1]) == i and len(last[1]) < size:
                last[1].append(self.points[i])
            else:
                batches.append((i, [self.points[i]]))
        return batches


class _Progress:
    """A progress line on stderr for a long pre-flight (every ~2 s after the first 2 s)."""

    def __init__(self, total: int) -> None:
        self.total, self.count, self.clock = total, 0, time.monotonic
        self.start = self.last = self.clock()
        self.shown = False

    def step(self, invalid: int) -> None:
        self.count += 1
        now = self.clock()
        if now - self.last >= 2.0 and now - self.start >= 2.0:
            self.last, self.shown = now, True
            sys.stderr.write(
                f"pre-flight: {self.count} of {self.total} sweep point(s) checked, "
                f"{invalid} cannot run ({now - self.start:.0f} s)\n"
            )
            sys.stderr.flush()

    def done(self) -> None:
        if self.shown:
            sys.stderr.write(
                f"pre-flight: all {self.total} point(s) checked in "
                f"{self.clock() - self.start:.1f} s\n"
            )
