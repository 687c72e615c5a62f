"""The pre-flight sweeper: every sweep point is checked before the first job starts.

Hydra's basic sweeper expands the sweep (cartesian product of the overrides and
``hydra.sweeper.params``) and this one keeps that; what it adds, checking every point
and launching only what can run, is :class:`art_hydra.sweeps.grid.GridSweep`.
"""

# No `from __future__ import annotations` here: Hydra's plugin scan executes this module
# before registering it in sys.modules, and dataclasses with string annotations look the
# module up there.
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser

from art_hydra.config.hydra_compat import basic_sweeper
from art_hydra.config.problems import Problem
from art_hydra.preflight.sweep_folder import release_sweep_folder
from art_hydra.sweeps.grid import GridSweep, preflight_points
from art_hydra.sweeps.points import point_checker
from art_hydra.sweeps.reports import (
    refuse_a_launcher_that_cannot_start,
    refuse_a_used_sweep_folder,
)
from art_hydra.sweeps.sweeper_space import refuse_keys_given_twice


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
        """Each point's problems, as job number ``i`` will see it."""
        assert self.hydra_context is not None and self.config is not None
        self.checker = point_checker(self.hydra_context.config_loader, self.config)
        return preflight_points(self.checker, self.config, points)

    def sweep(self, arguments: list[str]) -> Any:
        assert self.config is not None and self.launcher is not None
        refuse_keys_given_twice(self.config)
        refuse_a_used_sweep_folder(self.config)
        try:
            refuse_a_launcher_that_cannot_start(self.config)
            points = self.points(arguments)
            checked = self.preflight(points)
            return GridSweep(
                self.config,
                self.launcher,
                self.checker,
                points,
                checked,
                max_batch_size=self.max_batch_size,
                skip_invalid=self.skip_invalid,
            ).run()
        finally:  # the sweep has ended: its folder may be used again (resume=auto)
            release_sweep_folder(Path(str(self.config.hydra.sweep.dir)))
