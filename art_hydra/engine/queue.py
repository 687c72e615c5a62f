"""The producer <-> trainer exchange: one optimizer step's work in, one result out.

What crosses is :class:`StepWork`, every micro-batch of one optimizer step (SFT's
``gradient_accumulation_steps`` micro-batches, RL's one packed input), each carrying the
step's loss denominator (set once, by ``packing.one_step``). The producer puts a
step's work and waits for its ``result``; the trainer's thread turns each into exactly
one result (the warmup pass too).

Deadlocks are detected at once, naming both waits (:class:`DeadlockError`): a step's work
with fewer micro-batches than the trainer takes per step (the founding example: RL with
``trainer.gradient_accumulation_steps=2`` past the validators), where the trainer would
wait for an input the producer never sends while the producer waits for the result
(:meth:`StepWork.require`, as the trainer takes it); and a producer waiting for a result
it never asked for. Every other wait is bounded by the timeout of one kind of work
(:class:`StallError` names what overran and what the other side was doing): the
producer's wait for a result or for room on the queue by ``timeouts.step_s``; the
trainer's wait for its next job by ``queue.input_timeout_s``, a clock that stops while
the producer declares bounded work of its own (:meth:`StepChannel.producer_phase`:
sampling, scoring, a checkpoint write), so a slow reward or disk is never blamed on the
queue. A trainer exception reaches the producer within :data:`POLL_S`, with its
traceback; :meth:`StepChannel.close` stops and joins the thread on every exit path.

All torch work runs on the trainer's thread: the producer hands its own (sampling,
packing) over with :meth:`StepChannel.run_on_trainer_thread`. On the CPU every thread
that runs torch ops brings its own OpenMP team, and two teams taking turns on the same
cores cost the default run 40% of its speed. The one producer thread calls ``put``,
``result`` and ``run_on_trainer_thread``, never concurrently, and keeps the protocol,
the clocks, signals and the run's record.

Overlapped rollouts (``rl.overlap_rollouts``, :class:`art_hydra.engine.producer.RolloutsAhead`)
plug in between ``put`` and ``result``: with a step's work on the queue the producer's
thread is free, so it starts sampling the next generation batch on a thread of its own
(the producer's copy of the policy, half the cores), waits for it after the result, and
refreshes that copy while neither thread computes.
"""

from __future__ import annotations

import contextlib
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from art_hydra import moved, workers
from art_hydra.errors import DeadlockError, StallError

if TYPE_CHECKING:
    from art_hydra.config.schema import QueueConfig

#: The longest a waiting producer sleeps between checks that the trainer thread is
#: alive (seconds); every state change wakes it sooner.
POLL_S = 0.05
#: How long closing waits for a step still in flight to finish (seconds).
CLOSE_GRACE_S = 10.0

log = moved.logger(__name__)  # the name it logged under before the move

#: Why a producer's input-per-step count meets a trainer that wants more (the founding
#: deadlock's usual cause), and the fix; every deadlock message ends with it.
_LIKELY_CAUSE = (
    "it expects more inputs per optimizer step than the producer sends. Likely cause: RL "
    "with trainer.gradient_accumulation_steps > 1 (RL sends one input per optimizer step); "
    "use trainer.gradient_accumulation_steps=1 and put the whole step in "
    "trainer.per_device_train_batch_size."
)


class TrainerError(RuntimeError):
    """The trainer thread raised; the message carries its traceback."""


@dataclass
class StepWork:
    """One optimizer step's work, the unit that crosses the queue.

    ``micro_batches`` are packed inputs (``packing.PackedBatch``), each already carrying
    the step's loss denominator; ``warmup``: one forward and backward that changes no
    weight and no optimizer moment.
    """

    micro_batches: list[Any]
    warmup: bool = False

    @property
    def samples(self) -> list[dict[str, Any]]:
        """The records of what the step trained on (completions.jsonl)."""
        return self.micro_batches[0].samples

    def require(self, micro_batches: int, step: int) -> None:
        """Refuse work that does not make step ``step`` of ``micro_batches`` inputs: fewer
        is the founding deadlock (:class:`DeadlockError`, naming both waits)."""
        handed = len(self.micro_batches)
        if handed < micro_batches:
            raise DeadlockError(
                f"deadlock: the producer waits for the result of step {step} while the "
                f"trainer waits for input #{handed + 1} of that step, and the producer sent "
                f"the step as {handed} input(s), so neither can ever move. The trainer takes "
                f"{micro_batches} inputs per optimizer step (trainer.gradient_accumulation_"
                f"steps): {_LIKELY_CAUSE}"
            )
        if handed > micro_batches:
            raise ValueError(
                f"step {step}'s work holds {handed} micro-batches; the trainer takes "
                f"{micro_batches} per optimizer step (trainer.gradient_accumulation_steps)"
            )


@dataclass(eq=False)
class _Job:
    """A call for the trainer's thread: a step's work (``step``: its exception ends the
    trainer) or the producer's own torch work (its exception is handed back)."""

    fn: Callable[[], Any]
    what: str
    step: bool
    done: bool = False
    value: Any = None
    error: BaseException | None = None


class StepChannel:
    """Runs ``train_fn(work)`` for each step's work on a background thread; see the
    module docstring. ``train_fn`` returns the step's result."""

    def __init__(
        self, queue_cfg: QueueConfig, train_fn: Callable[[Any], Any], step_timeout_s: float
    ) -> None:
        self._cfg = queue_cfg
        self._step_timeout = step_timeout_s
        self._train_fn = train_fn
        self._cond = threading.Condition()
        # Everything below is read and written under self._cond only.
        #: Jobs for the trainer's thread, in the order handed over.
        self._todo: deque[_Job] = deque()
        #: The steps put whose results the producer has not taken (queued, running, done).
        self._owed: deque[_Job] = deque()
        #: Steps the trainer has taken (numbers the inputs in messages).
        self._taken = 0
        self._stopping = False
        #: What ended the trainer's thread (None while it runs).
        self._error: BaseException | None = None
        #: The bounded work the producer declared it is doing (None: none).
        self._phase: str | None = None
        #: What each side is doing, for messages.
        self.trainer_state = "starting"
        self._producer_state = "starting"
        self._thread = workers.start(self._run, "trainer")

    # -- trainer side -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while (job := self._take()) is not None:
                try:
                    job.value = job.fn()
                except BaseException as exc:
                    if job.step:
                        raise
                    job.error = exc  # the producer's own work: re-raised by the producer
                with self._cond:
                    job.done = True
                    self.trainer_state = f"done with input #{self._taken}"
                    self._cond.notify_all()
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self.trainer_state = f"stopped by {type(exc).__name__}"
                self._cond.notify_all()

    def _take(self) -> _Job | None:
        """The next job (None once closing), waiting at most ``queue.input_timeout_s``
        for it, a clock that stops while the producer is in a declared phase."""
        timeout = self._cfg.input_timeout_s
        with self._cond:
            self.trainer_state = f"waiting for input #{self._taken + 1}"
            deadline = time.monotonic() + timeout
            while not self._todo and not self._stopping:
                if self._phase is not None:
                    self._cond.wait()  # the phase has its own bound; it notifies at its end
                    deadline = time.monotonic() + timeout
                elif (remaining := deadline - time.monotonic()) > 0:
                    self._cond.wait(remaining)
                else:
                    raise StallError(
                        f"the trainer waited {timeout:g}s (queue.input_timeout_s) for input "
                        f"#{self._taken + 1} while the producer was {self._producer_state}, "
                        "outside any bounded work of its own"
                    )
            if self._stopping:
                return None
            job = self._todo.popleft()
            self._taken += int(job.step)
            self.trainer_state = (
                f"training on input #{self._taken}" if job.step else f"{job.what} for the producer"
            )
            self._cond.notify_all()  # room on the queue for a waiting put
            return job

    # -- producer side ------------------------------------------------------------
    def put(self, work: Any) -> None:
        """Hand one step's work to the trainer (waits for room on the queue while the
        trainer finishes a step, bounded by ``timeouts.step_s``)."""
        job = _Job(lambda: self._train_fn(work), "a step", step=True)
        with self._cond:
            self._producer_state = "putting an input"
            self._wait_for(
                lambda: sum(j.step for j in self._todo) < self._cfg.maxsize,
                self._step_timeout,
                f"the producer waited {self._step_timeout:g}s (timeouts.step_s) to put an "
                "input on a full queue; the trainer is",
            )
            self._todo.append(job)
            self._owed.append(job)
            self._producer_state = "producing the next input"
            self._cond.notify_all()

    def result(self, step: int) -> Any:
        """The result of optimizer step ``step``, the oldest step put and not yet
        answered: waits at most ``timeouts.step_s``; :class:`DeadlockError` at once when
        no step is owed (the trainer waits for an input nothing will send)."""
        with self._cond:
            self._producer_state = f"waiting for the result of step {step}"
            self._raise_if_trainer_failed()
            if not self._owed:
                raise DeadlockError(
                    f"deadlock: the producer waits for the result of step {step} while the "
                    f"trainer waits for input #{self._taken + 1}, and no input is queued and "
                    f"no result is pending, so neither can ever move: {_LIKELY_CAUSE}"
                )
            job = self._owed[0]
            self._wait_for(
                lambda: job.done,
                self._step_timeout,
                f"optimizer step {step} did not finish within {self._step_timeout:g}s "
                "(timeouts.step_s); the trainer is",
            )
            self._owed.popleft()
            self._producer_state = "producing the next input"
            return job.value

    def run_on_trainer_thread(self, fn: Callable[[], Any], what: str, timeout_s: float) -> Any:
        """``fn()`` run on the trainer's thread (the producer's torch work: sampling,
        packing), waited for at most ``timeout_s``; its exception is re-raised here. The
        trainer's wait for an input does not run out meanwhile."""
        job = _Job(fn, what, step=False)
        with self.producer_phase(what), self._cond:
            self._todo.append(job)
            self._cond.notify_all()
            try:
                self._wait_for(
                    lambda: job.done,
                    timeout_s,
                    f"{what} did not finish within {timeout_s:g}s (the sum of its timeouts.*); "
                    "it runs on the trainer's thread, which is",
                )
            finally:
                if job in self._todo:  # not started: it must never run later
                    self._todo.remove(job)
        if job.error is not None:
            raise job.error
        return job.value

    @contextlib.contextmanager
    def producer_phase(self, what: str) -> Iterator[None]:
        """Declare bounded producer work (``what``, for messages): the trainer's wait for
        an input does not run out while it lasts; its own timeout bounds it."""
        with self._cond:
            self._phase = self._producer_state = what
        try:
            yield
        finally:
            with self._cond:
                self._phase = None
                self._producer_state = f"done {what}"
                self._cond.notify_all()

    def _wait_for(self, ready: Callable[[], bool], timeout_s: float, overran: str) -> None:
        """Wait (holding the lock) until ``ready()``, re-raising the trainer's failure
        within :data:`POLL_S`; after ``timeout_s``, :class:`StallError` saying what
        ``overran`` and what the trainer is doing."""
        deadline = time.monotonic() + timeout_s
        self._raise_if_trainer_failed()
        while not ready():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise StallError(f"{overran} {self.trainer_state}")
            self._cond.wait(min(remaining, POLL_S))
            self._raise_if_trainer_failed()

    def _raise_if_trainer_failed(self) -> None:
        error = self._error
        if isinstance(error, StallError):  # a bound or a deadlock: its message says it all
            raise type(error)(str(error)) from error
        if error is not None:
            raise TrainerError(
                f"the trainer failed: {type(error).__name__}: {error}\n"
                f"--- trainer traceback ---\n{''.join(traceback.format_exception(error))}"
            ) from error
        if not self._thread.is_alive():
            raise TrainerError("the trainer thread ended without a result")

    def close(self) -> bool:
        """Stop the trainer thread and wait for it (idempotent); True once it has ended.

        The trainer checks for the stop between jobs, so the wait is the rest of the
        step in progress, at most :data:`CLOSE_GRACE_S` (a step that overran its bound has
        already been waited for).
        """
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(CLOSE_GRACE_S)
        if self._thread.is_alive():
            log.warning(
                "the trainer thread is still %s after %gs; it is a daemon and ends with the "
                "process",
                self.trainer_state,
                CLOSE_GRACE_S,
            )
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
