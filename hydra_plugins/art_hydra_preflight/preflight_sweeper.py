"""The pre-flight sweeper: every sweep point is validated before the first job starts.

Hydra's basic sweeper composes each batch just before launching it and runs no
validators, so a bad point deep in a sweep is found after earlier jobs have run, or
never. This sweeper expands the sweep the same way (cartesian product of the
overrides and ``hydra.sweeper.params``), composes and validates every point in the
parent process, prints each invalid point with its overrides and problems, and
launches nothing. With ``hydra.sweeper.skip_invalid=true`` it launches the valid points
and names the skipped ones. Any launcher works (basic, joblib, submitit, ...).
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# before registering it in sys.modules, and dataclasses with string annotations look the
# module up there.
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import CompactHydraException
from omegaconf import OmegaConf

from art_hydra.config.composition import compose_and_check
from art_hydra.config.problems import format_report

log = logging.getLogger(__name__)


@dataclass
class PreflightSweeperConf:
    """Settings of ``hydra/sweeper=preflight`` (the default in art_hydra's conf)."""

    # The sweeper class Hydra instantiates.
    _target_: str = "hydra_plugins.art_hydra_preflight.preflight_sweeper.PreflightSweeper"
    # Jobs handed to the launcher at once; null launches all valid points in one batch.
    max_batch_size: int | None = None
    # Sweep definitions kept in config, e.g. {trainer.learning_rate: "1e-5,1e-4"}.
    params: dict[str, str] = field(default_factory=dict)
    # Launch the valid points and name the skipped ones, instead of launching nothing.
    skip_invalid: bool = False


class SweepPreflightError(CompactHydraException):
    """Some sweep points cannot run; the message lists each with its problems."""


class PreflightSweeper(BasicSweeper):
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

    def preflight(self, points: list[list[str]]) -> list[tuple[list[str], list[Any]]]:
        """Compose and validate each point as the launcher will; (overrides, problems)."""
        assert self.hydra_context is not None and self.config is not None
        loader = self.hydra_context.config_loader
        return [
            (point, compose_and_check(loader, None, point, master=self.config).problems)
            for point in points
        ]

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        points = self.points(arguments)
        checked = self.preflight(points)
        invalid = [(i, pt, probs) for i, (pt, probs) in enumerate(checked) if probs]
        valid = [pt for pt, probs in checked if not probs]
        dry_run = bool(self.config.get("dry_run", False))
        if invalid:
            report = _sweep_report(invalid, len(points))
            if not self.skip_invalid:
                raise SweepPreflightError(
                    f"{report}\nNo job was launched. Fix the points above, or add "
                    "hydra.sweeper.skip_invalid=true to run the valid ones."
                )
            if not valid:
                raise SweepPreflightError(f"{report}\nNo point is valid; no job was launched.")
            verb = "would launch" if dry_run else "launching"
            log.warning(
                f"{report}\nSkipping these {len(invalid)} point(s); {verb} the {len(valid)} "
                "valid one(s) (job folders are numbered among the launched points)."
            )
        if dry_run:
            lines = "\n".join(f"  ok: {' '.join(pt) or '(no overrides)'}" for pt in valid)
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
        returns = []
        job_idx = 0
        for batch in self.split_overrides_to_chunks(valid, self.max_batch_size):
            results = self.launcher.launch(batch, initial_job_idx=job_idx)
            for r in results:
                _ = r.return_value  # re-raises a failed job's exception, as Hydra's sweeper does
            job_idx += len(batch)
            returns.append(results)
        return returns


def _sweep_report(invalid: list[tuple[int, list[str], list[Any]]], total: int) -> str:
    parts = [f"Pre-flight: {len(invalid)} of {total} sweep point(s) cannot run."]
    for index, point, problems in invalid:
        header = f"Point #{index}: {' '.join(point) or '(no overrides)'}"
        parts.append(format_report(problems, header=header, footer=None))
    return "\n".join(parts)
