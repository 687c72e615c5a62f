"""The pre-flight sweeper: every sweep point is checked before the first job starts.

Hydra's basic sweeper composes each batch just before launching it and runs no
validators, so a bad point deep in a sweep is found after earlier jobs have run, or
never. This sweeper expands the sweep the same way (cartesian product of the overrides
and ``hydra.sweeper.params``), then composes each point as its job will see it (its job
number and output folder, so ``${hydra:job.num}`` is evaluated as in the job), checks it
and runs the world pre-flight for it, all in the parent process. If any point cannot
run it prints each one with its overrides and problems and launches nothing. With
``hydra.sweeper.skip_invalid=true`` it launches the valid points, each under its own
number, and names the skipped ones. Any launcher works (basic, joblib, submitit, ...).
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# before registering it in sys.modules, and dataclasses with string annotations look the
# module up there.
import logging
import sys
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from art_hydra.config.hydra_compat import basic_sweeper
from art_hydra.config.problems import Problem, errors, warnings_of
from art_hydra.errors import full_error
from hydra_plugins.art_hydra_preflight.preflight_launcher import (
    _record_refusal,
    fail_if_unfinished,
    point_checker,
    ranks_per_job,
)
from hydra_plugins.art_hydra_preflight.reports import (
    _fail,
    _sweep_report,
    _warning_report,
    refuse_a_used_sweep_folder,
)

log = logging.getLogger(__name__)


class PreflightSweeper(basic_sweeper()):  # type: ignore[misc]
    """A basic sweeper that checks every point before launching any."""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        skip_invalid: bool = False,
    ) -> None:
        super().__init__(max_batch_size=max_batch_size, params=params)
        self.skip_invalid = skip_invalid

    def points(self, arguments: list[str]) -> list[list[str]]:
        """Every sweep point's overrides, in launch order."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides([*self._parse_config(), *arguments])
        return [list(p) for p in self.split_arguments(overrides, None)[0]]

    def preflight(self, points: list[list[str]]) -> list[list[Problem]]:
        """Each point's problems, composed and checked as job number ``i`` will see it
        (:class:`~art_hydra.sweep_preflight.PointChecker`: once per group selection)."""
        from art_hydra.config.validators import planned_launch

        assert self.hydra_context is not None and self.config is not None
        launcher = self.config.hydra.launcher
        checker = self.checker = point_checker(self.hydra_context.config_loader, self.config)
        found: list[list[Problem]] = []
        progress = _Progress(len(points))
        with planned_launch(ranks_per_job(launcher)):
            for index, point in enumerate(points):
                found.append(checker.problems(point, index))
                progress.step(sum(1 for p in found if errors(p)))
        progress.done()
        return found

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        refuse_a_used_sweep_folder(self.config)
        points = self.points(arguments)
        checked = self.preflight(points)
        invalid = [i for i, problems in enumerate(checked) if errors(problems)]
        valid = [i for i in range(len(points)) if i not in invalid]
        warned = [(i, points[i], warnings_of(checked[i])) for i in valid if warnings_of(checked[i])]
        if warned:
            log.warning(_warning_report(warned, len(points)))
        dry_run = bool(self.config.get("dry_run", False))
        if invalid:
            report = _sweep_report([(i, points[i], checked[i]) for i in invalid], len(points))
            if not self.skip_invalid:
                _fail(
                    f"{report}\nNo job was launched. Fix the points above, or add "
                    "hydra.sweeper.skip_invalid=true to run the valid ones."
                )
            if not valid:
                _fail(f"{report}\nNo point is valid; no job was launched.")
            if not dry_run:  # each skipped point's folder says why it never ran
                for i in invalid:
                    folder = self.checker.run_dirs.get(i)
                    if folder is not None:
                        _record_refusal(folder, i, points[i], checked[i])
            verb = "would launch" if dry_run else "launching"
            log.warning(
                f"{report}\nSkipping these {len(invalid)} point(s); {verb} the {len(valid)} "
                "valid one(s) under their own numbers."
            )
        if dry_run:
            lines = "\n".join(
                f"  ok #{i}: {' '.join(points[i]) or '(no overrides)'}" for i in valid
            )
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
        returns = self._launch(valid, points)
        from art_hydra.sweep_summary import finish_sweep

        sys.stdout.write(finish_sweep(sweep_dir).rstrip() + "\n")
        fail_if_unfinished(getattr(self.launcher, "outcomes", {}))
        return returns

    def _launch(self, valid: list[int], points: list[list[str]]) -> list[Any]:
        """Launch the checked points in batches of at most ``max_batch_size``, each job under
        its point's number; every job runs, whatever another one did."""
        launch_checked = getattr(self.launcher, "launch_checked", None)
        returns = []
        for start, batch in self._batches(valid, points):
            try:
                if launch_checked is not None:
                    done = launch_checked([(start + k, p) for k, p in enumerate(batch)])
                    results = [done[start + k] for k in range(len(batch))]
                else:
                    results = self.launcher.launch(batch, initial_job_idx=start)
            except Exception as exc:
                # A job launched elsewhere (submitit) comes back as a trace in a string.
                remote = type(exc).__name__ in ("FailedJobError", "UncompletedJobError")
                if not remote or full_error():
                    raise
                _fail(f"A job of the sweep stopped:\n{remote_failure(str(exc))}")
            returns.append(results)
        return returns

    def _batches(self, valid: list[int], points: list[list[str]]) -> list[tuple[int, list[Any]]]:
        """Runs of consecutive point numbers, at most ``max_batch_size`` long: a launcher
        numbers a batch's jobs from its first index, so each job keeps its point's number
        (the one ``${hydra:job.num}`` was checked with)."""
        size = self.max_batch_size or len(points)
        batches: list[tuple[int, list[Any]]] = []
        for i in valid:
            last = batches[-1] if batches else None
            if last is not None and last[0] + len(last[1]) == i and len(last[1]) < size:
                last[1].append(points[i])
            else:
                batches.append((i, [points[i]]))
        return batches


class _Progress:
    """A progress line on stderr for a long pre-flight (every ~2 s after the first 2 s)."""

    def __init__(self, total: int) -> None:
        import time

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


def remote_failure(text: str) -> str:
    """The gist of a failed submitit job: the error its task raised (the trace's last
    line, without the exception's module path) and where its full logs are; or, for a
    task that died without a result, submitit's account of it and its last output."""
    if "has not produced any output" in text:
        account, _, tail = text.partition("-" * 40)
        last = [f"  | {line}" for line in tail.strip().splitlines()[-6:]]
        return "\n".join(
            [
                account.strip(),
                "The task's process died (killed, out of memory, or a crash in native "
                "code); its last output:",
                *last,
            ]
        )
    trace, _, rest = text.partition("----------------------\n")[2].partition(
        "----------------------"
    )
    lines = [line for line in trace.splitlines() if line.strip()]
    last = lines[-1] if lines else text.splitlines()[0]
    # A message spans lines after its "module.Error: " head; keep it whole.
    for i in range(len(lines) - 1, -1, -1):
        head = lines[i].split(":", 1)[0]
        if head and " " not in head and not lines[i].startswith(" "):
            last = "\n".join([lines[i].split(": ", 1)[-1], *lines[i + 1 :]])
            break
    logs = [line.strip()[2:] for line in rest.splitlines() if line.strip().startswith("- ")]
    where = f"\nFull logs: {', '.join(logs)}" if logs else ""
    return f"{last}{where}"
