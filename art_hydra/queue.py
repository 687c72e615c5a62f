"""The producer <-> trainer channel, with every wait bounded.

The producer puts an input and waits for that optimizer step's result; the trainer
runs in a background thread, takes inputs, and emits exactly one result per optimizer
step (and one for the optional warmup pass). Nothing waits forever: a stall on either
side raises :class:`StallError` naming who waits for what and for how long; an
exception in the trainer reaches the producer within a poll interval and is re-raised
with the trainer's traceback; :meth:`StepChannel.close` stops and joins the thread on
every exit path (normal end, error, Ctrl-C).
"""

from __future__ import annotations

import contextlib
import logging
import queue as stdlib_queue
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

#: How often a waiting side checks on the other (seconds): the latency with which a
#: trainer error or shutdown is noticed.
POLL_S = 0.05

_STOP = object()

log = logging.getLogger(__name__)


class StallError(RuntimeError):
    """One side waited longer than its ``cfg.queue`` timeout for the other."""


class TrainerError(RuntimeError):
    """The trainer thread raised; the message carries its traceback."""


class StepChannel:
    """Runs ``train_fn`` on inputs in a background thread; see the module docstring.

    ``train_fn(input)`` returns a result when an optimizer step (or warmup pass)
    completes, or None while it accumulates micro-batches.
    """

    def __init__(self, queue_cfg: Any, train_fn: Callable[[Any], Any]) -> None:
        self._cfg = queue_cfg
        self._train_fn = train_fn
        self._inputs: stdlib_queue.Queue[Any] = stdlib_queue.Queue(maxsize=queue_cfg.maxsize)
        self._results: stdlib_queue.Queue[Any] = stdlib_queue.Queue()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._error_text = ""
        #: What the trainer is doing right now, for stall messages.
        self.trainer_state = "starting"
        self._producer_state = "starting"
        self._thread = threading.Thread(target=self._run, name="art-hydra-trainer", daemon=True)
        self._thread.start()

    # -- trainer side -------------------------------------------------------------
    def _run(self) -> None:
        received = 0
        try:
            while not self._stop.is_set():
                self.trainer_state = f"waiting for input #{received + 1}"
                item = self._get_input(received + 1)
                if item is _STOP:
                    return
                received += 1
                self.trainer_state = f"training on input #{received}"
                result = self._train_fn(item)
                if result is not None:
                    self._results.put(result)
        except BaseException as exc:
            self._error = exc
            self._error_text = "".join(traceback.format_exception(exc))
            self.trainer_state = f"stopped by {type(exc).__name__}"

    def _get_input(self, number: int) -> Any:
        deadline = time.monotonic() + self._cfg.input_timeout_s
        while not self._stop.is_set():
            try:
                return self._inputs.get(timeout=POLL_S)
            except stdlib_queue.Empty:
                if time.monotonic() >= deadline:
                    raise StallError(
                        f"the trainer waited {self._cfg.input_timeout_s:g}s "
                        f"(queue.input_timeout_s) for input #{number}; the producer is "
                        f"{self._producer_state}"
                    ) from None
        return _STOP

    # -- producer side ------------------------------------------------------------
    def put(self, item: Any) -> None:
        """Hand one input to the trainer (bounded by ``queue.result_timeout_s``)."""
        self._producer_state = "putting an input"
        deadline = time.monotonic() + self._cfg.result_timeout_s
        while True:
            self._raise_if_trainer_failed()
            try:
                self._inputs.put(item, timeout=POLL_S)
                self._producer_state = "producing the next input"
                return
            except stdlib_queue.Full:
                if time.monotonic() >= deadline:
                    raise StallError(
                        f"the producer waited {self._cfg.result_timeout_s:g}s to put an input "
                        f"on a full queue; the trainer is {self.trainer_state}"
                    ) from None

    def result(self, step: int) -> Any:
        """Wait for the result of optimizer step ``step`` (bounded)."""
        self._producer_state = f"waiting for the result of step {step}"
        deadline = time.monotonic() + self._cfg.result_timeout_s
        while True:
            try:
                value = self._results.get(timeout=POLL_S)
                self._producer_state = "producing the next input"
                return value
            except stdlib_queue.Empty:
                self._raise_if_trainer_failed()
                if time.monotonic() >= deadline:
                    raise StallError(
                        f"the producer waited {self._cfg.result_timeout_s:g}s "
                        f"(queue.result_timeout_s) for the result of step {step}; the trainer "
                        f"is {self.trainer_state}"
                    ) from None

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

        The trainer checks for the stop between inputs, so the wait is bounded by the step
        in progress, and by ``queue.result_timeout_s`` at most.
        """
        self._stop.set()
        with contextlib.suppress(stdlib_queue.Full):
            self._inputs.put_nowait(_STOP)
        self._thread.join(self._cfg.result_timeout_s)
        if self._thread.is_alive():
            log.warning(
                "the trainer thread is still %s after %gs; it is a daemon and ends with the "
                "process",
                self.trainer_state,
                self._cfg.result_timeout_s,
            )
        return not self._thread.is_alive()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
