"""Every sweep point checked before its job starts, whatever sweeper generates it.

Value-driven sweepers (Optuna and the like) draw points as they go and hand each batch
to the launcher, so no sweeper can check a whole study up front. art_hydra therefore
puts the configured launcher (basic, joblib, submitit, ...) behind the pre-flight
launcher (the plugin, :mod:`hydra_plugins.art_hydra_preflight.preflight_launcher`), whose
work is :class:`CheckedLaunches`: each point of a batch is checked as its job will see
it and only the valid ones are launched, under their own job numbers. A refused point
never starts (a SLURM sweep never queues it): its folder gets a ``result.json`` with the
problems, and the sweeper gets the worst value for its direction
(:class:`~art_hydra.sweeps.search_space.Refused`), so a study goes on and learns to
avoid that region rather than stopping at its first invalid trial.

Jobs that fail are all named; a worker killed under the launcher (the OOM killer ending
a joblib worker) is reported with the jobs it was running and the ones not yet started,
which are then launched again.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from art_hydra import moved
from art_hydra.config.problems import Problem, errors
from art_hydra.sweeps.points import (
    checked_by_the_sweeper,
    point_checker,
    ranks_per_job,
    record_refusal,
)
from art_hydra.sweeps.reports import (
    fail,
    fail_if_unfinished,
    numbers,
    overrides_text,
    refuse_a_launcher_that_cannot_start,
    refuse_a_used_sweep_folder,
)
from art_hydra.sweeps.search_space import Refused, check_search_space, worst_value
from art_hydra.sweeps.sweeper_space import is_optuna, refuse_keys_given_twice

log = moved.logger(__name__)  # the name it logged under before the move


class CheckedLaunches:
    """The launches of one sweep through its configured launcher (``inner``), each point
    checked first; what did not run or did not finish, and why, is kept."""

    #: This process's sweep (the command summarises it when Hydra returns).
    current: CheckedLaunches | None = None

    def __init__(self, inner: Any) -> None:
        CheckedLaunches.current = self
        self.inner = inner
        self.config: DictConfig | None = None
        self.hydra_context: Any = None
        self._checker: Any = None
        #: Job number -> why it did not run or did not finish (refused, failed, killed).
        self.outcomes: dict[int, str] = {}
        #: Points refused and jobs launched, over the whole sweep.
        self.refused = 0
        self.launched = 0
        #: Optuna trials refused before launch and replaced: (trial number, point, problems).
        self.refused_trials: list[tuple[int, list[str], list[Problem]]] = []
        #: (point, job number) -> its problems, for points checked before their batch.
        self._checked: dict[tuple[tuple[str, ...], int], list[Problem]] = {}

    def setup(self, hydra_context: Any, config: DictConfig) -> None:
        """Before a sweeper that is not art_hydra's starts: its folder and search space."""
        self.config, self.hydra_context = config, hydra_context
        if not checked_by_the_sweeper(config):
            refuse_keys_given_twice(config)
            if is_optuna(config):  # its refused trials are replaced, not counted
                from art_hydra.config.hydra_compat import wrap_optuna_trials
                from art_hydra.sweeps.optuna_trials import configure_trials

                wrap_optuna_trials(configure_trials)
            refuse_a_used_sweep_folder(config)
            refuse_a_launcher_that_cannot_start(config)
            check_search_space(config, self.checker)

    def finish(self) -> None:
        """After a sweep whose sweeper is not art_hydra's: the summary of its folder, and
        exit status 1 if a launched job failed (refused points are part of a study)."""
        if self.config is None or checked_by_the_sweeper(self.config):
            return
        try:
            self._report()
        finally:  # the sweep has ended: its folder may be used again (resume=auto)
            from art_hydra.preflight.sweep_folder import release_sweep_folder

            release_sweep_folder(Path(str(self.config.hydra.sweep.dir)))

    def _report(self) -> None:
        """The summary, the refused draws, and the exit status."""
        from art_hydra.sweeps.summary import finish_sweep

        assert self.config is not None
        sys.stdout.write(finish_sweep(str(self.config.hydra.sweep.dir)).rstrip() + "\n")
        if self.refused_trials:
            n_trials = OmegaConf.select(self.config, "hydra.sweeper.n_trials", default="?")
            sys.stdout.write(
                f"{len(self.refused_trials)} drawn trial(s) were refused before launch "
                f"(recorded under {self.config.hydra.sweep.dir}/refused/); they did not count "
                f"against hydra.sweeper.n_trials={n_trials}: {self.launched} trial(s) launched.\n"
            )
        fail_if_unfinished(self.outcomes)
        if self.refused and not self.launched:
            fail(
                f"No trial of the study ran: all {self.refused} were refused (see above); the "
                "sweeper's 'Best' names a refused point. Narrow the search space."
            )

    def checker(self) -> Any:
        """The sweep's point checker (its caches serve every batch)."""
        if self._checker is None:
            assert self.config is not None and self.hydra_context is not None
            self._checker = point_checker(self.hydra_context.config_loader, self.config)
        return self._checker

    # ---- pre-flight ------------------------------------------------------------

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        """Check each point of a batch, refuse the invalid ones, launch the others. A
        sweeper's points are written as the command line's are (a key of an open mapping
        or of a reward entry added with ``++``: Optuna's ``task.rewards.0.weight`` on an
        entry whose file left it out), so the job composes what was checked."""
        from art_hydra.config.composition import open_mapping_adds

        assert self.config is not None
        job_overrides = [open_mapping_adds(point) for point in job_overrides]
        refused = self._refused(job_overrides, initial_job_idx)
        self.refused += len(refused)
        returns: dict[int, JobReturn] = {}
        for num, problems in refused.items():
            point = list(job_overrides[num - initial_job_idx])
            returns[num] = self._refuse(num, point, problems)
        valid = [
            (initial_job_idx + i, list(p))
            for i, p in enumerate(job_overrides)
            if initial_job_idx + i not in refused
        ]
        if self.config.get("dry_run", False):
            # The sweeper would go on drawing (and writing its results): stop here.
            lines = "".join(f"\n  ok #{n}: {overrides_text(p)}" for n, p in valid)
            print(
                f"dry run: the search space and the {len(job_overrides)} point(s) the sweeper "
                f"drew first were pre-flighted ({len(valid)} valid); nothing was launched.{lines}"
            )
            sys.exit(0)
        self.launched += len(valid)
        self._record_the_sweep()
        returns.update(self.launch_checked(valid))
        return [self._sweepable(returns[initial_job_idx + i]) for i in range(len(job_overrides))]

    def _refused(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> dict[int, list[Problem]]:
        """Job number -> problems, for each point of the batch that cannot run."""
        from art_hydra.config.launch_plan import planned_launch

        assert self.config is not None
        refused: dict[int, list[Problem]] = {}
        with planned_launch(ranks_per_job(self.config.hydra.launcher)):
            for i, point in enumerate(job_overrides):
                problems = self._problems(list(point), initial_job_idx + i)
                if errors(problems):
                    refused[initial_job_idx + i] = problems
        return refused

    def _problems(self, point: list[str], num: int) -> list[Problem]:
        """The point's problems as job ``num`` (checked once: a trial checked before its
        batch is not checked again at launch)."""
        key = (tuple(point), num)
        if key not in self._checked:
            self._checked[key] = self.checker().problems(point, num)
        return self._checked[key]

    def trial_problems(self, point: Sequence[str], num: int) -> list[Problem]:
        """A drawn trial's problems, before its batch is launched, as :meth:`launch` will
        check it (:mod:`art_hydra.sweeps.optuna_trials`)."""
        from art_hydra.config.composition import open_mapping_adds
        from art_hydra.config.launch_plan import planned_launch

        assert self.config is not None
        with planned_launch(ranks_per_job(self.config.hydra.launcher)):
            return self._problems(list(open_mapping_adds(list(point))), num)

    def _record_the_sweep(self) -> None:
        """``multirun.yaml`` in the sweep folder, as Hydra's basic sweeper writes it (Optuna's
        does not): the folder is then known as this sweep's, to summarise and continue."""
        assert self.config is not None
        if checked_by_the_sweeper(self.config):
            return  # the pre-flight sweeper writes it
        folder = Path(str(self.config.hydra.sweep.dir))
        record = folder / "multirun.yaml"
        if not record.exists() and not record.is_symlink():
            folder.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, record)

    def _sweepable(self, result: JobReturn) -> JobReturn:
        """A finished job whose objective is NaN (it logged no value of the metric) is
        told to the sweeper as the worst value: Optuna fails on a NaN it is told."""
        value = result._return_value
        if result.status == JobStatus.COMPLETED and isinstance(value, float) and math.isnan(value):
            from art_hydra.engine.result import RunResult

            summary = dict(value) if hasattr(value, "keys") else {}
            result._return_value = RunResult(worst_value(self.config), summary)
        return result

    def _refuse(self, num: int, point: list[str], problems: list[Problem]) -> JobReturn:
        assert self.config is not None
        reason = "; ".join(f"{p.key}: {p.reason}" for p in errors(problems))
        self.outcomes[num] = f"refused: {reason}"
        causes = "; ".join(f"{p.key} = {p.value}" for p in errors(problems))
        log.warning(
            f"Point #{num} was not launched ({causes}; see its result.json): "
            f"{overrides_text(point)}"
        )
        folder = self._job_folder(num, point)
        if folder is not None and not self.config.get("dry_run", False):
            record_refusal(folder, num, point, problems)
        value = Refused(worst_value(self.config), problems)
        return JobReturn(
            overrides=point, working_dir=folder, status=JobStatus.COMPLETED, _return_value=value
        )

    def _job_folder(self, num: int, point: list[str]) -> str | None:
        checker = self.checker()
        if num not in checker.run_dirs:
            try:
                checker.problems(point, num)
            except Exception:
                return None
        return checker.run_dirs.get(num)

    # ---- launching -------------------------------------------------------------

    def launch_checked(self, points: list[tuple[int, list[str]]]) -> dict[int, JobReturn]:
        """Launch checked points, each under its own number (a launcher numbers a batch's
        jobs from its first index, so runs of consecutive numbers go together). A worker
        killed under the launcher ends that batch; the points it never started go again."""
        returns: dict[int, JobReturn] = {}
        pending = list(points)
        while pending:
            runs = _consecutive(pending)
            pending = []
            for start, batch in runs:
                try:
                    results = self.inner.launch(batch, initial_job_idx=start)
                except Exception as exc:
                    if type(exc).__name__ not in ("TerminatedWorkerError", "BrokenProcessPool"):
                        raise
                    _wait_for_the_pool_to_end(exc)
                    pending += self._after_a_killed_worker(start, batch, returns)
                    continue
                for offset, result in enumerate(results):
                    returns[start + offset] = result
                    if result.status == JobStatus.FAILED:
                        self.outcomes[start + offset] = (
                            f"failed: {_first_line(result._return_value)}"
                        )
        return returns

    def _after_a_killed_worker(
        self, start: int, batch: list[list[str]], returns: dict[int, JobReturn]
    ) -> list[tuple[int, list[str]]]:
        """Which jobs of a batch had run, were running or never started when a worker was
        killed; the never-started ones are returned to be launched again."""
        ran, running, again = [], [], []
        for offset, point in enumerate(batch):
            num = start + offset
            status = _recorded_status(self._job_folder(num, point))
            if status in ("done", "failed", "interrupted"):
                ran.append(num)
                returns[num] = _record_return(point, status)
                if status != "done":
                    self.outcomes[num] = status
            elif status is None:
                again.append((num, point))
            else:
                running.append(num)
                self.outcomes[num] = "killed: its worker process ended (out of memory, or a signal)"
                returns[num] = JobReturn(
                    overrides=point,
                    status=JobStatus.FAILED,
                    _return_value=RuntimeError("killed: its worker process ended"),
                )
        sys.stderr.write(
            "A worker process of the launcher was killed (out of memory, or a signal). "
            f"Job(s) it was running: {numbers(running) or 'none recorded'}; "
            f"finished before: {numbers(ran) or 'none'}; "
            f"never started, launching them again: {numbers([n for n, _ in again]) or 'none'}.\n"
        )
        return again


def _wait_for_the_pool_to_end(exc: BaseException) -> None:
    """After one loky worker died, its pool's other workers are ended asynchronously: one
    may still start a job (make its folder) after the launcher reads which jobs started,
    and that job would be neither named as killed nor launched again. Wait until every
    worker of the pool has ended before reading (joblib's loky; another pool's workers
    were ended by the pool itself)."""
    if type(exc).__name__ != "TerminatedWorkerError":
        return
    try:
        from joblib.externals.loky import get_reusable_executor

        get_reusable_executor().shutdown(wait=True, kill_workers=True)
    except Exception:  # nothing left to end
        pass


def _consecutive(points: list[tuple[int, list[str]]]) -> list[tuple[int, list[list[str]]]]:
    runs: list[tuple[int, list[list[str]]]] = []
    for num, point in sorted(points, key=lambda p: p[0]):
        if runs and runs[-1][0] + len(runs[-1][1]) == num:
            runs[-1][1].append(point)
        else:
            runs.append((num, [point]))
    return runs


def _first_line(exc: Any) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _recorded_status(folder: str | None) -> str | None:
    """The status a job's ``result.json`` records (None: no record, never started)."""
    if folder is None:
        return None
    from art_hydra.safe_json import read

    if not os.path.exists(Path(folder) / "result.json"):
        return None if not os.path.isdir(folder) else "running"
    try:
        record = read(Path(folder) / "result.json")
    except ValueError:
        return "running"
    return str(record.get("status", "running")) if isinstance(record, dict) else "running"


def _record_return(point: list[str], status: str) -> JobReturn:
    if status == "done":
        return JobReturn(overrides=point, status=JobStatus.COMPLETED, _return_value=None)
    return JobReturn(overrides=point, status=JobStatus.FAILED, _return_value=RuntimeError(status))
