"""The producer <-> trainer channel: deadlocks detected at once, stalls bounded.

The producer puts an input and waits for that optimizer step's result; the trainer
runs in a background thread, takes inputs, and emits exactly one result per optimizer
step (and one for the optional warmup pass).

All of the channel's state (queued inputs, pending results, what each side waits for)
sits under one condition variable, so the channel always knows both sides' waits at
the same instant. When the producer waits for a result while the trainer waits for an
input and nothing is in flight (no input queued, no result pending), neither side can
ever move: that is a deadlock, and :class:`DeadlockError` is raised in the producer at
once, naming both waits. The seed's example is RL with
``trainer.gradient_accumulation_steps=2``: the producer sends one input per step and
waits for its result; the trainer waits for a second input before stepping.

Timeouts remain as the last resort for work that is genuinely stuck, each covering
one kind of work: the producer waits at most ``timeouts.step_s`` for a step's result
(or for room to put an input); the trainer waits at most ``queue.input_timeout_s`` for
its next input, and that clock stops while the producer declares bounded work of its
own (:meth:`StepChannel.producer_phase`: sampling, scoring, a checkpoint write, each
bounded by its own ``timeouts.*``), so a slow reward or a slow disk is never blamed on
the queue. :class:`StallError` names what overran, for how long, and what the other
side was doing. An exception in the trainer wakes the producer at
once (within :data:`POLL_S` at worst) and is re-raised with the trainer's traceback;
:meth:`StepChannel.close` stops and joins the thread on every exit path.

The protocol has one producer thread: ``put`` and ``result`` are called from it, never
concurrently (another thread putting while ``result`` waits would look like a deadlock).

All torch work runs on the trainer's thread: the producer hands its own (sampling,
packing) over with :meth:`StepChannel.run_on_trainer_thread` and waits for it, bounded.
On the CPU each OS thread that runs torch ops gets an OpenMP team of its own, and two
teams taking turns on the same cores cost the default run 40% of its speed (teams spin
and hand off caches); one compute thread keeps one team. The producer's thread keeps the
protocol, the clocks, signals and the run's record.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from art_hydra import workers
from art_hydra.errors import DeadlockError, StallError

#: The longest a waiting producer sleeps between checks that the trainer thread is
#: alive (seconds); every state change wakes it sooner.
POLL_S = 0.05
#: How long closing waits for a step still in flight to finish (seconds).
CLOSE_GRACE_S = 10.0

log = logging.getLogger(__name__)


class TrainerError(RuntimeError):
    """The trainer thread raised; the message carries its traceback."""


class _Stopped(Exception):
    """The channel was closed while the trainer waited for an input."""


class _Work:
    """The producer's work, run on the trainer's thread: its value or its exception."""

    def __init__(self, fn: Callable[[], Any], what: str) -> None:
        self.fn, self.what = fn, what
        self.done = False
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn()
        except BaseException as exc:  # handed back to the producer, which re-raises it
            self.error = exc


class StepChannel:
    """Runs ``train_fn`` on inputs in a background thread; see the module docstring.

    ``train_fn(input)`` returns a result when an optimizer step (or warmup pass)
    completes, or None while it accumulates micro-batches.
    """

    def __init__(
        self, queue_cfg: Any, train_fn: Callable[[Any], Any], step_timeout_s: float
    ) -> None:
        self._cfg = queue_cfg
        self._step_timeout = step_timeout_s
        self._train_fn = train_fn
        self._cond = threading.Condition()
        # Everything below is read and written under self._cond only.
        self._inputs: deque[Any] = deque()
        self._work: deque[_Work] = deque()
        self._results: deque[Any] = deque()
        self._stopping = False
        self._error: BaseException | None = None
        self._error_text = ""
        #: Inputs the trainer has taken, and how many since its last result.
        self._taken = 0
        self._since_result = 0
        #: True while the trainer is blocked waiting for its next input.
        self._trainer_waits = False
        #: What the trainer is doing right now, for error messages.
        self.trainer_state = "starting"
        self._producer_state = "starting"
        #: The bounded work the producer declared it is doing (None: none).
        self._producer_phase: str | None = None
        self._thread = workers.start(self._run, "trainer")

    # -- trainer side -------------------------------------------------------------
    def _run(self) -> None:
        try:
            while True:
                item = self._next_input()
                result = self._train_fn(item)
                with self._cond:
                    if result is not None:
                        self._results.append(result)
                        self._since_result = 0
                    self.trainer_state = f"done with input #{self._taken}"
                    self._cond.notify_all()
        except _Stopped:
            return
        except BaseException as exc:
            with self._cond:
                self._error = exc
                self._error_text = "".join(traceback.format_exception(exc))
                self.trainer_state = f"stopped by {type(exc).__name__}"
                self._cond.notify_all()

    def _next_input(self) -> Any:
        """The next input, waiting at most ``queue.input_timeout_s`` for it, not counting
        the time the producer spends in a declared phase (bounded by its own timeout)."""
        timeout = self._cfg.input_timeout_s
        with self._cond:
            number = self._taken + 1
            deadline = time.monotonic() + timeout
            self.trainer_state = f"waiting for input #{number}"
            self._trainer_waits = True
            self._cond.notify_all()  # a producer waiting for a result re-checks for deadlock
            try:
                while not self._inputs:
                    if self._stopping:
                        raise _Stopped
                    if self._work:
                        self._run_work(self._work.popleft(), number)
                        deadline = time.monotonic() + timeout
                        continue
                    if self._producer_phase is not None:
                        self._cond.wait()  # the phase has its own bound; it notifies at its end
                        deadline = time.monotonic() + timeout
                        continue
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise StallError(
                            f"the trainer waited {timeout:g}s (queue.input_timeout_s) for input "
                            f"#{number} while the producer was {self._producer_state}, outside "
                            "any bounded work of its own"
                        )
                    self._cond.wait(remaining)
                if self._stopping:
                    raise _Stopped
                item = self._inputs.popleft()
            finally:
                self._trainer_waits = False
            self._taken = number
            self._since_result += 1
            self.trainer_state = f"training on input #{number}"
            self._cond.notify_all()  # room on the queue for a waiting put
            return item

    def _run_work(self, work: _Work, number: int) -> None:
        """Run the producer's work (called holding the lock; runs it without)."""
        self._trainer_waits = False
        self.trainer_state = f"{work.what} for the producer"
        self._cond.release()
        try:
            work.run()
        finally:
            self._cond.acquire()
        work.done = True
        self._trainer_waits = True
        self.trainer_state = f"waiting for input #{number}"
        self._cond.notify_all()

    # -- producer side ------------------------------------------------------------
    def run_on_trainer_thread(self, fn: Callable[[], Any], what: str, timeout_s: float) -> Any:
        """``fn()`` run on the trainer's thread (the producer's torch work: sampling,
        packing), waited for at most ``timeout_s``; its exception is re-raised here. The
        trainer's wait for an input does not run out meanwhile."""
        work = _Work(fn, what)
        with self.producer_phase(what), self._cond:
            self._raise_if_trainer_failed()
            self._work.append(work)
            self._cond.notify_all()
            deadline = time.monotonic() + timeout_s
            while not work.done:
                self._raise_if_trainer_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    if work in self._work:  # not started: it must never run later
                        self._work.remove(work)
                    raise StallError(
                        f"{what} did not finish within {timeout_s:g}s (the sum of its "
                        "timeouts.*); it runs on the trainer's thread, which is "
                        f"{self.trainer_state}"
                    )
                self._cond.wait(min(remaining, POLL_S))
        if work.error is not None:
            raise work.error
        return work.value

    @contextlib.contextmanager
    def producer_phase(self, what: str) -> Iterator[None]:
        """Declare bounded producer work (``what``, for messages): the trainer's wait for
        an input does not run out while it lasts; its own timeout bounds it."""
        with self._cond:
            self._producer_phase = what
            self._producer_state = what
        try:
            yield
        finally:
            with self._cond:
                self._producer_phase = None
                self._producer_state = f"done {what}"
                self._cond.notify_all()

    def put(self, item: Any) -> None:
        """Hand one input to the trainer (waits for room while the trainer finishes its
        step, bounded by ``timeouts.step_s``)."""
        timeout = self._step_timeout
        with self._cond:
            self._producer_state = "putting an input"
            deadline = time.monotonic() + timeout
            while len(self._inputs) >= self._cfg.maxsize:
                self._raise_if_trainer_failed()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StallError(
                        f"the producer waited {timeout:g}s (timeouts.step_s) to put an input on "
                        f"a full queue; the trainer is {self.trainer_state}"
                    )
                self._cond.wait(min(remaining, POLL_S))
            self._raise_if_trainer_failed()
            self._inputs.append(item)
            self._producer_state = "producing the next input"
            self._cond.notify_all()

    def result(self, step: int) -> Any:
        """Wait for the result of optimizer step ``step``: raises :class:`DeadlockError`
        as soon as the trainer waits for an input that nothing will send, and
        :class:`StallError` after ``timeouts.step_s``."""
        timeout = self._step_timeout
        with self._cond:
            self._producer_state = f"waiting for the result of step {step}"
            deadline = time.monotonic() + timeout
            while not self._results:
                self._raise_if_trainer_failed()
                if self._trainer_waits and not self._inputs:
                    raise DeadlockError(self._deadlock_message(step))
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise StallError(
                        f"optimizer step {step} did not finish within {timeout:g}s "
                        f"(timeouts.step_s); the trainer is {self.trainer_state}"
                    )
                self._cond.wait(min(remaining, POLL_S))
            self._producer_state = "producing the next input"
            return self._results.popleft()

    def _deadlock_message(self, step: int) -> str:
        taken = self._since_result
        return (
            f"deadlock: the producer waits for the result of step {step} while the trainer "
            f"waits for input #{self._taken + 1}, and no input is queued and no result is "
            f"pending, so neither can ever move. The trainer has taken {taken} input(s) "
            "since its last result and wants more before it steps: it expects more inputs "
            "per optimizer step than the producer sends. Likely cause: RL with "
            "trainer.gradient_accumulation_steps > 1 (RL sends one input per optimizer "
            "step); use trainer.gradient_accumulation_steps=1 and put the whole step in "
            "trainer.per_device_train_batch_size."
        )

    def _raise_if_trainer_failed(self) -> None:
        if self._error is not None:
            if isinstance(self._error, StallError):
                raise StallError(str(self._error)) from self._error
            raise TrainerError(
                f"the trainer failed: {type(self._error).__name__}: {self._error}\n"
                f"--- trainer traceback ---\n{self._error_text}"
            ) from self._error
        if not self._thread.is_alive():
            raise TrainerError("the trainer thread ended without a result")

    def close(self) -> bool:
        """Stop the trainer thread and wait for it (idempotent); True once it has ended.

        The trainer checks for the stop between inputs, so the wait is the rest of the
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
