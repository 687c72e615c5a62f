"""Why a run stopped, when the reason is known: printed as its message alone.

These subclass Hydra's ``CompactHydraException``, so Hydra and the CLI print the
message without a traceback (``HYDRA_FULL_ERROR=1`` shows one). A crash in the
trainer's own code keeps its traceback (``art_hydra.queue.TrainerError``).
"""

from __future__ import annotations

import os

from hydra.errors import CompactHydraException


def full_error() -> bool:
    """Whether the user asked Hydra for tracebacks (``HYDRA_FULL_ERROR=1``): the one
    place that reads it, for the CLI and the pre-flight sweeper alike."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


class RunStopped(CompactHydraException, RuntimeError):
    """The run stopped for a reason the message explains; the process exits with
    :attr:`exit_code`."""

    exit_code = 1


class StallError(RunStopped):
    """Work overran its bound (a ``timeouts.*`` or ``queue.input_timeout_s``)."""


class DeadlockError(StallError):
    """Both sides of the queue wait on each other with nothing in flight."""


class RewardError(RunStopped):
    """The reward function raised, hung, or returned something that is not a finite
    number; the message names the reward, the prompt and the completion."""


class WriteError(RunStopped):
    """The run could not write its outputs (a full disk, a read-only folder); what is
    already on disk stays whole, and the message says what to resume from."""


class Interrupted(RunStopped):
    """SIGINT or SIGTERM: the run saved its last completed step and stopped."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
