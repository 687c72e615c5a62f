"""Why a run stopped, when the reason is known: printed as its message alone.

These subclass Hydra's ``CompactHydraException``, so Hydra and the CLI print the
message without a traceback (``HYDRA_FULL_ERROR=1`` shows one). A crash in the
trainer's own code keeps its traceback (``art_hydra.engine.queue.TrainerError``).
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


class InvalidDistributionError(RunStopped):
    """A sampling step's next-token probabilities were NaN, infinite, negative or all
    zero (``torch.multinomial`` refuses such rows; the fast draw checks them itself).

    The message names the training step (added by the producer), the completion (its
    index in the generation batch and its prompt), the decoding step, and the likely
    cause read from the row's logits; a run stops on it rather than training on the pad
    id it would otherwise draw.
    """

    def __init__(
        self,
        rows: list[int],
        batch: int,
        position: int,
        problem: str,
        cause: str,
        step: int | None = None,
        prompts: list[str] | None = None,
    ) -> None:
        self.rows, self.batch, self.position = rows, batch, position
        self.problem, self.cause, self.step, self.prompts = problem, cause, step, prompts
        super().__init__(self._text())

    def _text(self) -> str:
        first = self.rows[0]
        when = (
            ""
            if self.step is None
            else " in the warmup pass"
            if self.step == 0
            else f" at training step {self.step}"
        )
        prompt = f" (prompt {self.prompts[first][:60]!r})" if self.prompts else ""
        others = len(self.rows) - 1
        more = f" and {others} other completion(s) ({_listed(self.rows[1:])})" if others else ""
        return (
            f"sampling stopped{when}: completion {first} of {self.batch}{prompt}{more} had "
            f"{self.problem} next-token probabilities at decoding step {self.position} "
            f"(its new token {self.position + 1}). Likely cause: {self.cause}"
        )

    def remapped(self, indices: list[int], batch: int) -> InvalidDistributionError:
        """The same error with rows of a sub-batch named by their index in the whole batch."""
        rows = sorted(indices[r] for r in self.rows)
        return InvalidDistributionError(rows, batch, self.position, self.problem, self.cause)

    def located(self, step: int | None, prompts: list[str]) -> InvalidDistributionError:
        """The same error naming the training step (0: the warmup pass) and the prompts."""
        return InvalidDistributionError(
            self.rows, self.batch, self.position, self.problem, self.cause, step, prompts
        )


def _listed(rows: list[int], shown: int = 8) -> str:
    text = ", ".join(str(r) for r in rows[:shown])
    return text + (", ..." if len(rows) > shown else "")


class ResumeError(CompactHydraException, FileNotFoundError):
    """``resume=true`` found nothing to resume from (a user's mistake: no traceback)."""


class RunFolderBusy(ResumeError):
    """Another live process holds the run folder's lock: one run per folder (a report,
    no traceback). A :class:`ResumeError` only so that code which caught that for this
    case, as it was raised before, still catches it."""
