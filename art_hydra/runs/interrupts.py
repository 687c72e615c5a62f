"""SIGINT, SIGTERM and SIGHUP: keep the work, then stop cleanly, at any moment.

While a run trains, the first signal asks it to stop after the optimizer step in
progress: the loop then writes a checkpoint at that step, flushes its metrics and raises
:class:`~art_hydra.errors.Interrupted`, which the CLI prints as one paragraph (the step
reached and the exact resume command) with exit status 130 (SIGINT), 143 (SIGTERM) or
129 (SIGHUP: the terminal or ssh session closed), the shell's convention. A second
signal exits at once, saving nothing more (the last checkpoint on disk stays whole:
checkpoints are renamed into place). SIGTERM is the usual preemption signal on clusters,
so a preempted job resumes where it stopped.

Outside the training loop (the command's imports, composition, Hydra's start, and the
end of a run) there is nothing in progress to keep: the ``art-hydra`` command exits at
once with one line and the same status, never a ``KeyboardInterrupt`` traceback
(:func:`exit_on_signals`). A SIGHUP that ``nohup`` (or the parent) set to be ignored
stays ignored. Handlers are installed only in the main thread (Python allows nothing
else).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shlex
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

#: Signals that ask a run to stop, and their names in messages.
STOP_SIGNALS = {signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGTERM: "SIGTERM"}
if hasattr(signal, "SIGHUP"):  # POSIX only
    STOP_SIGNALS[signal.SIGHUP] = "SIGHUP (terminal closed)"

#: What the process is doing when no run trains: named by the line a signal prints.
_phase = "start-up"


def say(text: str) -> None:
    """Write to stderr from a signal handler: unbuffered, and silent when stderr is gone
    (after SIGHUP the terminal may be closed, and a failed write must not become the
    traceback the handler exists to avoid)."""
    with contextlib.suppress(OSError):
        os.write(2, text.encode())


def _flush_quietly() -> None:
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed terminal, or a reentrant write
            stream.flush()


def _respected_ignore(signum: int) -> bool:
    """Whether ``signum`` was set to be ignored on purpose and must stay so: ``nohup``
    ignores SIGHUP so a run outlives its terminal. (SIGINT ignored by a background job
    of a non-interactive shell is still handled, as before.)"""
    return signum == getattr(signal, "SIGHUP", None) and signal.getsignal(signum) == signal.SIG_IGN


def _exit_now(signum: int, frame: object) -> None:
    """Outside the training loop: one line, the shell's status, nothing half-done kept."""
    if _phase == "start-up":
        what = (
            "during start-up, before training began: nothing was trained or saved; run the "
            "same command again to start."
        )
    else:
        what = "outside the training loop; the checkpoints written so far are whole."
    say(f"\nart_hydra: {STOP_SIGNALS.get(signum, 'a signal')} received {what}\n")
    _flush_quietly()
    os._exit(128 + signum)


def exit_on_signals() -> None:
    """Make every stop signal end the ``art-hydra`` command at once with one line (its
    start-up and shut-down; the training loop installs :func:`stop_on_signals` over it).
    Only the command calls this: a program that calls ``train()`` keeps its own handlers."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in STOP_SIGNALS:
        if not _respected_ignore(signum):
            signal.signal(signum, _exit_now)


def launched_as_command() -> bool:
    """Whether this process is the ``art-hydra`` command (``art-hydra ...``, ``python -m
    art_hydra ...``, or torchrun's ranks of it), not a program importing the package."""
    if os.path.basename(sys.argv[0] or "") == "art-hydra":
        return True
    argv = list(getattr(sys, "orig_argv", []))
    return any(a == "-m" and b == "art_hydra" for a, b in itertools.pairwise(argv))


class StopRequest:
    """Set by the first stop signal; read by the training loop between steps."""

    def __init__(self) -> None:
        self.signum: int | None = None
        #: Across ranks: whether any rank had a stop request at the last step's combine
        #: (the only stop decision ranks act on, so they stop at the same step).
        self.agreed = False
        #: Run by a second signal before the process exits (the run sets it to leave a
        #: folder without a checkpoint restartable); returns a line to print, or "".
        self.before_exit: Callable[[], str] | None = None

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
            say("\nart_hydra: second interrupt: exiting now without saving more.\n")
            if self.before_exit is not None:
                with contextlib.suppress(Exception):  # exiting matters more than tidying
                    say(self.before_exit())
            _flush_quietly()
            os._exit(128 + signum)
        self.signum = signum
        say(
            f"\nart_hydra: {STOP_SIGNALS[signum]} received: finishing the step in progress and "
            "saving a checkpoint; interrupt again to exit at once.\n"
        )


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Route the stop signals to a :class:`StopRequest` for the duration of a run."""
    global _phase
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request  # no handlers outside the main thread: signals keep their defaults
        return
    routed = [s for s in STOP_SIGNALS if not _respected_ignore(s)]
    previous = {s: signal.getsignal(s) for s in routed}
    for s in routed:
        signal.signal(s, request._handle)
    try:
        yield request
    finally:
        _phase = "shut-down"
        if not request.requested:  # after a stop request, a second signal still exits
            for s, handler in previous.items():
                signal.signal(s, handler)


def continue_sweep_command() -> str | None:
    """Inside a sweep's job, the command that continues the whole sweep: the sweep's own
    command-line overrides (from its ``multirun.yaml``, which the sweeper writes before
    the first job starts; a job's own overrides hold only its point) with ``resume=auto``
    and the sweep's folder, shell-quoted. None outside a sweep, or without that file."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    from art_hydra.config.run_files import SWEEP_FILES
    from art_hydra.config.yaml_guard import load_bounded
    from art_hydra.runs.run_folder import in_sweep

    if not in_sweep():
        return None
    sweep_dir = Path(str(HydraConfig.get().sweep.dir)).resolve()
    try:
        master = load_bounded(sweep_dir / SWEEP_FILES[0])  # size, nesting, aliases bounded
        given = OmegaConf.to_container(master.hydra.overrides, resolve=False)
    except Exception:  # a stop message must never fail for want of this line
        return None
    assert isinstance(given, dict)
    dropped = ("resume", "hydra.sweep.dir", "hydra.mode")
    kept = [
        str(o)
        for o in [*(given.get("task") or []), *(given.get("hydra") or [])]
        if str(o).lstrip("+~").partition("=")[0] not in dropped
    ]
    parts = ["art-hydra", "-m", *kept, "resume=auto", f"hydra.sweep.dir={sweep_dir}"]
    return " ".join(shlex.quote(p) for p in parts)
