"""The pre-flight launcher: the configured launcher, behind a check of every point.

art_hydra puts every sweeper's launcher behind this one
(:func:`art_hydra.sweeps.plugins.wrap_launchers`), so points a sweeper draws as it goes
(Optuna's trials) are checked before their jobs start; the work is
:class:`art_hydra.sweeps.launching.CheckedLaunches`.
"""

# No `from __future__ import annotations`: Hydra's plugin scan executes this module
# before registering it in sys.modules (see preflight_sweeper.py).
from collections.abc import Sequence
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from omegaconf import DictConfig

from art_hydra.sweeps.launching import CheckedLaunches


class PreflightLauncher(Launcher):
    """The configured launcher, behind a pre-flight of every point it is given."""

    def __init__(self, inner: Launcher) -> None:
        self.launches = CheckedLaunches(inner)

    def setup(self, *, hydra_context: Any, task_function: Any, config: DictConfig) -> None:
        self.launches.setup(hydra_context, config)

    def launch(
        self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int
    ) -> Sequence[JobReturn]:
        return self.launches.launch(job_overrides, initial_job_idx)
