"""Why a run stopped, when the reason is known: printed as its message alone.

These subclass Hydra's ``CompactHydraException``, so Hydra and the CLI print the
message without a traceback (``HYDRA_FULL_ERROR=1`` shows one). A crash in the
trainer's own code keeps its traceback (``art_hydra.engine.queue.TrainerError``).
"""

from __future__ import annotations

import functools
import os
import sysconfig
import traceback
from pathlib import Path

from hydra.errors import CompactHydraException

#: art_hydra's own folder: a frame there is the engine, not the user's code.
_PACKAGE = str(Path(__file__).resolve().parent) + os.sep


def full_error() -> bool:
    """Whether the user asked Hydra for tracebacks (``HYDRA_FULL_ERROR=1``): the one
    place that reads it, for the CLI and the pre-flight sweeper alike."""
    return os.environ.get("HYDRA_FULL_ERROR") == "1"


@functools.cache
def _libraries() -> tuple[str, ...]:
    """The standard library's and the installed packages' folders: a frame there is a
    library the user's code called, not the line the user wrote."""
    paths = sysconfig.get_paths()
    names = ("stdlib", "platstdlib", "purelib", "platlib")
    return tuple(str(Path(paths[n]).resolve()) + os.sep for n in names if n in paths)


def _in(folders: str | tuple[str, ...], frame: traceback.FrameSummary) -> bool:
    return str(Path(frame.filename).resolve()).startswith(folders)


def user_frames(exc: BaseException) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback in the code art_hydra called (a reward, a
    generator): those after art_hydra's last frame, innermost last."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [i for i, f in enumerate(frames) if _in(_PACKAGE, f)]
    return frames[own[-1] + 1 :] if own else frames


def _written_by_user(frames: list[traceback.FrameSummary]) -> list[traceback.FrameSummary]:
    """Of the frames art_hydra called, those outside the libraries the user's code used."""
    return [f for f in frames if not _in(_libraries(), f)]


def _shown_path(filename: str) -> str:
    path = Path(filename).resolve()
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def user_code_site(exc: BaseException) -> str | None:
    """Where the user's code raised ``exc``: ``my_rewards.py:12, in my_reward``, the
    innermost frame of theirs (a library it called is skipped); None when no user frame
    is in the traceback."""
    frames = user_frames(exc)
    if not frames:
        return None
    frame = (_written_by_user(frames) or frames)[-1]
    return f"{_shown_path(frame.filename)}:{frame.lineno}, in {frame.name}"


def raised(exc: BaseException) -> str:
    """A user's exception in one line: its type, its message and where their code
    raised it (``ValueError: bad row (my_rewards.py:12, in my_reward)``)."""
    site = user_code_site(exc)
    return f"{type(exc).__name__}: {exc}" + (f" ({site})" if site else "")


def user_traceback(exc: BaseException) -> str | None:
    """The traceback of the user's frames in ``exc`` or the first exception of its
    chain that has any (a :class:`RewardError` is raised from the reward's own), for the
    run's log file; None when none has (a failure inside art_hydra or a library it
    called keeps its own report)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        frames = user_frames(current)
        if _written_by_user(frames) and not isinstance(current, RunStopped):
            lines = traceback.format_list(frames)
            lines += traceback.format_exception_only(type(current), current)
            return "Traceback of the user's code (most recent call last):\n" + "".join(lines)
        current = current.__cause__ or current.__context__
    return None


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
