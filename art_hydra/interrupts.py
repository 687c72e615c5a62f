"""SIGINT and SIGTERM while a run trains: keep the work, then stop cleanly.

The first signal asks the run to stop after the optimizer step in progress: the loop
then writes a checkpoint at that step, flushes its metrics and raises
:class:`~art_hydra.errors.Interrupted`, which the CLI prints as one paragraph (the step
reached and the exact resume command) with exit status 130 (SIGINT) or 143 (SIGTERM),
the shell's convention. A second signal exits at once, saving nothing more (the last
checkpoint on disk stays whole: checkpoints are renamed into place). SIGTERM is the
usual preemption signal on clusters, so a preempted job resumes where it stopped.
Handlers are installed only in the main thread (Python allows nothing else).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator

#: Signals that ask a run to stop, and their names in messages.
STOP_SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}


class StopRequest:
    """Set by the first stop signal; read by the training loop between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        #: Across ranks: whether any rank had a stop request at the last step's combine
        #: (the only stop decision ranks act on, so they stop at the same step).
        self.agreed = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        if self.signum is None and self.agreed:
            return "a stop signal on another rank"
        return STOP_SIGNALS.get(self.signum or 0, "a signal")

    @property
    def exit_code(self) -> int:
        return 128 + (self.signum or signal.SIGTERM)

    def _handle(self, signum: int, frame: object) -> None:
        if self.signum is not None:
            os.write(2, b"\nart_hydra: second interrupt: exiting now without saving more.\n")
            os._exit(128 + signum)
        self.signum = signum
        os.write(
            2,
            f"\nart_hydra: {STOP_SIGNALS[signum]} received: finishing the step in progress and "
            "saving a checkpoint; interrupt again to exit at once.\n".encode(),
        )


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route SIGINT and SIGTERM to a :class:`StopRequest` for the duration of a run."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # no handlers outside the main thread: signals keep their defaults
        return
    previous = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    for s in STOP_SIGNALS:
        signal.signal(s, request._handle)
    try:
        yield request
    finally:
        if not request.requested:  # after a stop request, a second signal still exits
            for s, handler in previous.items():
                signal.signal(s, handler)
