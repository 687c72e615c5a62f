"""Every sweep point checked before its job starts, whatever sweeper generates it.

Value-driven sweepers (Optuna and the like) draw points as they go and hand each batch
to the launcher, so no sweeper can check a whole study up front. art_hydra therefore
puts the configured launcher (basic, joblib, submitit, ...) behind
:class:`PreflightLauncher`, which checks each point of a batch as its job will see it and
launches only the valid ones, under their own job numbers. A refused point never starts
(a SLURM sweep never queues it): its folder gets a ``result.json`` with the problems, and
the sweeper gets the worst value for its direction, so a study goes on and learns to
avoid that region rather than stopping at its first invalid trial.

Jobs that fail are all named; a worker killed under the launcher (the OOM killer ending
a joblib worker) is reported with the jobs it was running and the ones not yet started,
which are then launched again.
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module
# before registering it in sys.modules (see preflight_sweeper.py).
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig, OmegaConf

from art_hydra.config.hydra_compat import raw_list
from art_hydra.config.problems import Problem, errors, format_report
from art_hydra.config.trust import hand_of

log = logging.getLogger(__name__)


class Refused(float):
    """The value a sweeper gets for a point that was not launched: the worst for its
    direction (so a study learns from it), with the problems that refused it."""

    problems: list[Problem]

    def __new__(cls, value: float, problems: list[Problem]) -> "Refused":
        made = super().__new__(cls, value)
        made.problems = problems
        return made


class PreflightLauncher(Launcher):
    """The configured launcher, behind a pre-flight of every point it is given."""

    #: The launcher of this process's sweep (the command summarises it when Hydra returns).
    current: "PreflightLauncher | None" = None

    def __init__(self, inner: Launcher) -> None:
        PreflightLauncher.current = self
        self.inner = inner
        self.config: DictConfig | None = None
        self.hydra_context: Any = None
        self.task_function: Any = None
        self._checker: Any = None
        #: Job number -> why it did not run or did not finish (refused, failed, killed).
        self.outcomes: dict[int, str] = {}
        #: Points refused and jobs launched, over the whole sweep.
        self.refused = 0
        self.launched = 0

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function
        if "art_hydra_preflight" not in _target(config.hydra.sweeper):
            from hydra_plugins.art_hydra_preflight.reports import (
                refuse_a_used_sweep_folder,
            )

            refuse_a_used_sweep_folder(config)
            self.check_search_space()

    def finish(self) -> None:
        """After a sweep whose sweeper is not art_hydra's: the summary of its folder, and
        exit status 1 if a launched job failed (refused points are part of a study)."""
        from art_hydra.sweep_summary import finish_sweep

        if self.config is None or "art_hydra_preflight" in _target(self.config.hydra.sweeper):
            return
        sys.stdout.write(finish_sweep(str(self.config.hydra.sweep.dir)).rstrip() + "\n")
        from hydra_plugins.art_hydra_preflight.reports import _fail

        fail_if_unfinished(self.outcomes)
        if self.refused and not self.launched:
            _fail(
                f"No trial of the study ran: all {self.refused} were refused (see above); the "
                "sweeper's 'Best' names a refused point. Narrow the search space."
            )

    def check_search_space(self) -> None:
        """Before a sweeper that draws points as it goes starts its study: the fixed
        overrides must run, and so must some combination of the finite dimensions
        (``choice``/``range``; an interval is tried at both ends). Combinations that
        cannot run are named once, grouped by problem: the sweeper may draw them, and
        they will be refused, never launched."""
        from hydra_plugins.art_hydra_preflight.reports import _fail, _sweep_report

        assert self.config is not None
        directions = OmegaConf.select(self.config, "hydra.sweeper.direction", default=None)
        if OmegaConf.is_list(directions) and len(directions) > 1:
            _fail(
                f"hydra.sweeper.direction has {len(directions)} directions, but each art_hydra "
                "job returns one objective (objective.metric); every trial would train and "
                "then fail. Fix: hydra.sweeper.direction=maximize (or minimize, as "
                "objective.direction says). The study was not started."
            )
        mismatch = direction_mismatch(self.config)
        if mismatch:
            log.warning(mismatch)
        fixed, dims = search_space(self.config)
        combos = _combinations(dims)
        if combos is None:
            log.warning(
                "The search space has over %d combinations; each point is checked as it is drawn.",
                MAX_COMBINATIONS,
            )
            return
        points = [[*fixed, *combo] for combo in combos]
        from art_hydra.config.validators import planned_launch

        checker = self.checker()
        with planned_launch(ranks_per_job(self.config.hydra.launcher)):
            checked = [checker.problems(point, 0) for point in points]
        invalid = [(i, points[i], p) for i, p in enumerate(checked) if errors(p)]
        if not invalid:
            return
        report = _sweep_report(invalid, len(points), "combination", " of the search space")
        if len(invalid) == len(points):
            _fail(
                f"{report}\nNo combination of the search space can run; the study was not started."
            )
        log.warning(
            f"{report}\nThe sweeper may still draw these: such trials are refused before "
            "launch (the sweeper is given the worst value), never run."
        )

    # ---- pre-flight ------------------------------------------------------------

    def checker(self) -> Any:
        """The sweep's point checker (its caches serve every batch)."""
        if self._checker is None:
            assert self.config is not None and self.hydra_context is not None
            self._checker = point_checker(self.hydra_context.config_loader, self.config)
        return self._checker

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        from art_hydra.config.validators import planned_launch

        checker = self.checker()
        refused: dict[int, list[Problem]] = {}
        with planned_launch(ranks_per_job(self.config.hydra.launcher)):
            for i, point in enumerate(job_overrides):
                problems = checker.problems(list(point), initial_job_idx + i)
                if errors(problems):
                    refused[initial_job_idx + i] = problems
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
            lines = "".join(f"\n  ok #{n}: {' '.join(p) or '(no overrides)'}" for n, p in valid)
            print(
                f"dry run: the search space and the {len(job_overrides)} point(s) the sweeper "
                f"drew first were pre-flighted ({len(valid)} valid); nothing was launched.{lines}"
            )
            sys.exit(0)
        self.launched += len(valid)
        self._record_the_sweep()
        returns.update(self.launch_checked(valid))
        return [self._sweepable(returns[initial_job_idx + i]) for i in range(len(job_overrides))]

    def _record_the_sweep(self) -> None:
        """``multirun.yaml`` in the sweep folder, as Hydra's basic sweeper writes it (Optuna's
        does not): the folder is then known as this sweep's, to summarise and continue."""
        assert self.config is not None
        if "art_hydra_preflight" in _target(self.config.hydra.sweeper):
            return  # the pre-flight sweeper writes it
        folder = Path(str(self.config.hydra.sweep.dir))
        record = folder / "multirun.yaml"
        if not record.exists() and not record.is_symlink():
            folder.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(self.config, record)

    def _worst(self) -> float:
        return worst_value(self.config)

    def _sweepable(self, result: JobReturn) -> JobReturn:
        """A finished job whose objective is NaN (it logged no value of the metric) is
        told to the sweeper as the worst value: Optuna fails on a NaN it is told."""
        value = result._return_value
        if result.status == JobStatus.COMPLETED and isinstance(value, float) and math.isnan(value):
            from art_hydra.result import RunResult

            summary = dict(value) if hasattr(value, "keys") else {}
            result._return_value = RunResult(self._worst(), summary)
        return result

    def _refuse(self, num: int, point: list[str], problems: list[Problem]) -> JobReturn:
        reason = "; ".join(f"{p.key}: {p.reason}" for p in errors(problems))
        self.outcomes[num] = f"refused: {reason}"
        causes = "; ".join(f"{p.key} = {p.value}" for p in errors(problems))
        log.warning(
            f"Point #{num} was not launched ({causes}; see its result.json): "
            f"{' '.join(point) or '(no overrides)'}"
        )
        folder = self._job_folder(num, point)
        if folder is not None and not self.config.get("dry_run", False):
            _record_refusal(folder, num, point, problems)
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
            f"Job(s) it was running: {_numbers(running) or 'none recorded'}; "
            f"finished before: {_numbers(ran) or 'none'}; "
            f"never started, launching them again: {_numbers([n for n, _ in again]) or 'none'}.\n"
        )
        return again


def direction_mismatch(config: DictConfig) -> str | None:
    """A sweeper told to go the other way than the objective (maximising a loss)."""
    wanted = OmegaConf.select(config, "hydra.sweeper.direction", default=None)
    if wanted is None or OmegaConf.is_list(wanted):
        return None
    from art_hydra.config.objective import resolve

    try:
        spec = resolve(config.objective, config.algorithm.name)
    except Exception:
        return None
    wanted = str(getattr(wanted, "name", wanted)).lower()
    if wanted.endswith(spec.direction):
        return None
    return (
        f"hydra.sweeper.direction={wanted} but the objective {spec.metric} is better when "
        f"it is {'lower' if spec.direction == 'minimize' else 'higher'} "
        f"(objective.direction resolves to {spec.direction}): the study would search for "
        f"the worst runs. Fix: hydra.sweeper.direction={spec.direction}, or choose "
        "objective.metric / objective.direction."
    )


#: The most combinations of the finite dimensions checked before a study starts.
MAX_COMBINATIONS = 10_000


def search_space(config: DictConfig) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """``(fixed overrides, [(key, values to try)])`` of a sweep: the command line's task
    overrides and the sweeper's ``params``; a finite dimension gives its values, an
    interval its two ends."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import IntervalSweep

    texts = raw_list(config.hydra.overrides.task)
    params = OmegaConf.select(config, "hydra.sweeper.params", default=None)
    if isinstance(params, DictConfig):
        texts += [f"{k}={v}" for k, v in OmegaConf.to_container(params, resolve=False).items()]
    fixed: list[str] = []
    dims: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(texts):
        key = override.get_key_element()
        if not override.is_sweep_override():
            fixed.append(override.input_line)
            continue
        sweep = override.value()
        if isinstance(sweep, IntervalSweep):
            low, high = sweep.start, sweep.end
            if all(float(v).is_integer() for v in (low, high)) and "int" in str(
                getattr(sweep, "tags", "")
            ):
                low, high = int(low), int(high)
            dims[key] = [f"{key}={low}", f"{key}={high}"]
        else:
            dims[key] = [f"{key}={v}" for v in override.sweep_string_iterator()]
    fixed = [f for f in fixed if f.split("=", 1)[0].lstrip("+~") not in dims]
    return fixed, list(dims.items())


def _combinations(dims: list[tuple[str, list[str]]]) -> list[list[str]] | None:
    import itertools

    total = 1
    for _, values in dims:
        total *= max(len(values), 1)
    if total > MAX_COMBINATIONS:
        return None
    return [list(c) for c in itertools.product(*(values for _, values in dims))]


def point_checker(loader: Any, config: DictConfig) -> Any:
    """The checker of a sweep's points (:class:`~art_hydra.sweep_preflight.PointChecker`),
    with the user's hand from the command line; a SLURM job runs on the cluster's nodes,
    whose GPUs the job checks itself."""
    from art_hydra.sweep_preflight import PointChecker

    here = not _target(config.hydra.launcher).endswith("SlurmLauncher")
    return PointChecker(loader, config, sweep_hand(config), devices_here=here)


def fail_if_unfinished(outcomes: dict[int, str]) -> None:
    """Exit 1 if a job failed or was killed (the summary printed before names each, with
    why); refused points are not jobs that failed."""
    failed = sorted(n for n, why in outcomes.items() if not why.startswith("refused"))
    if failed:
        from hydra_plugins.art_hydra_preflight.reports import _fail

        _fail(f"{len(failed)} job(s) of the sweep did not finish: {_numbers(failed)}.")


def sweep_hand(config: DictConfig) -> Any:
    """What the user set by hand for the sweep: the command line, not sweeper params from a file."""
    given = OmegaConf.to_container(config.hydra.overrides, resolve=False)
    choices = set(config.hydra.runtime.choices)
    return hand_of([*given["hydra"], *given["task"]], lambda name: name in choices)


def worst_value(config: DictConfig | None) -> float:
    """The worst objective for the sweep's direction: the sweeper's own setting where it
    has one (Optuna's ``hydra.sweeper.direction``), else ``objective.direction``."""
    direction = (
        OmegaConf.select(config, "hydra.sweeper.direction", default=None) if config else None
    )
    if direction is None and config is not None:
        direction = OmegaConf.select(config, "objective.direction", default="maximize")
    if isinstance(direction, (list, tuple)) or OmegaConf.is_list(direction):
        direction = direction[0] if len(direction) else "maximize"
    name = str(getattr(direction, "name", direction)).lower()
    return math.inf if name.endswith("minimize") else -math.inf


def ranks_per_job(launcher: Any) -> int | None:
    """Processes a launcher starts for each job: nodes x tasks_per_node for submitit's
    launchers (each task one rank), None for launchers that run a job as one process."""
    if "hydra_submitit_launcher" not in _target(launcher):
        return None
    nodes = OmegaConf.select(launcher, "nodes", default=1) or 1
    tasks = OmegaConf.select(launcher, "tasks_per_node", default=1) or 1
    return int(nodes) * int(tasks)


def _target(node: Any) -> str:
    return str(OmegaConf.select(node, "_target_", default="") or "")


def _consecutive(points: list[tuple[int, list[str]]]) -> list[tuple[int, list[list[str]]]]:
    runs: list[tuple[int, list[list[str]]]] = []
    for num, point in sorted(points, key=lambda p: p[0]):
        if runs and runs[-1][0] + len(runs[-1][1]) == num:
            runs[-1][1].append(point)
        else:
            runs.append((num, [point]))
    return runs


def _numbers(nums: list[int]) -> str:
    return ", ".join(f"#{n}" for n in nums)


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


def _record_refusal(folder: str, num: int, point: list[str], problems: list[Problem]) -> None:
    """The refused point's folder records why it never ran (nothing else is written)."""
    from art_hydra.result import write_refused_result

    causes = "; ".join(f"{p.key} = {p.value}" for p in errors(problems))
    header = f"Point #{num} was not launched ({causes}):"
    text = format_report(errors(problems), header=header, footer=None)
    try:
        write_refused_result(folder, point, text, num)
    except OSError as exc:
        log.warning("could not record the refusal of point #%d in %s: %s", num, folder, exc)
