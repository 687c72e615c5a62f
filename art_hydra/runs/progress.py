"""Progress a run reports while it trains, where no progress bar shows.

On a terminal the run draws a bar (``logging.progress_bar``). Piped into a file, under
SLURM or nohup, a bar is noise (or nothing at all), and a run that prints one line and
then nothing until it ends tells its user nothing: there, a plain line goes to stdout
every ``logging.progress_every_steps`` steps or ``logging.progress_every_s`` seconds,
whichever comes first (and at the first and last step of the invocation). Every line
also goes to the job's log file (``art_hydra.log``), bar or not, so the file read after
the run says how it went. Only rank 0 reports (it alone keeps the run's record).

A stdout whose reader went away (``art-hydra ... | head -1``) is no failure of the run:
while it trains, writes there stop instead of raising (:func:`stdout_reader_may_go`).

The cadence and the line's text are pure functions, tested without a run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from art_hydra import moved

if TYPE_CHECKING:
    from art_hydra.config.schema import LoggingConfig

log = moved.logger(__name__)  # the name it logged under before the move


def progress_due(
    step: int,
    *,
    first_step: int,
    max_steps: int,
    every_steps: int,
    every_s: float,
    since_last_s: float | None,
) -> bool:
    """Whether ``step`` gets a progress line: the invocation's first step (the run has
    started), its last, every ``every_steps``-th step (0: never by count), and any step
    ``every_s`` seconds or more after the last line (``since_last_s``; None: no line
    yet)."""
    if step == first_step or step >= max_steps:
        return True
    if every_steps > 0 and step % every_steps == 0:
        return True
    return since_last_s is not None and since_last_s >= every_s


def clock(seconds: float) -> str:
    """``seconds`` as ``H:MM:SS`` (``M:SS`` under an hour)."""
    total = max(0, round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def progress_line(record: dict[str, Any], max_steps: int, elapsed_s: float, steps_done: int) -> str:
    """One plain progress line for a step's ``record`` (its metrics): step/max, the
    reward (RL) and the loss, tokens per second, time elapsed in this invocation and the
    estimate of what is left (from this invocation's mean step time; ``steps_done`` steps
    took ``elapsed_s``)."""
    step = int(record["step"])
    parts = [f"step {step}/{max_steps}"]
    reward = record.get("reward_mean")
    if isinstance(reward, (int, float)):
        parts.append(f"reward {reward:.3f}")
    calls = record.get("tool_calls_mean")
    if isinstance(calls, (int, float)):
        parts.append(f"tool calls {calls:.2f}")
    loss = record.get("loss")
    if isinstance(loss, (int, float)):
        parts.append(f"loss {loss:.4g}")
    speed = record.get("tokens_per_s")
    if isinstance(speed, (int, float)):
        parts.append(f"{speed:,.0f} tok/s")
    parts.append(f"elapsed {clock(elapsed_s)}")
    left = max(max_steps - step, 0)
    if steps_done > 0:
        parts.append(f"ETA {clock(elapsed_s / steps_done * left)}")
    return "progress: " + " | ".join(parts)


class _PipeSafe:
    """A text stream (stdout) whose writes never raise for a reader that went away (``|
    head``, a closed ssh pipe): the first ``BrokenPipeError`` points the descriptor at
    ``/dev/null`` (what was still to be written, and the interpreter's last flush, then
    succeed), and the run goes on; its record and log files say how it went."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _reader_gone(self._stream)
            return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _reader_gone(self._stream)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _reader_gone(stream: Any) -> None:
    """Point ``stream``'s descriptor at ``/dev/null`` and drop what it still held."""
    with contextlib.suppress(OSError, ValueError):
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    with contextlib.suppress(OSError, ValueError):
        stream.flush()


@contextlib.contextmanager
def stdout_reader_may_go() -> Iterator[None]:
    """While a run trains (and prints its result), a stdout whose reader went away (``|
    head -1``) is no failure: ``sys.stdout`` and the log handlers that write to it stop
    writing there instead of raising, so a run that trained all its steps is ``done``."""
    stream = sys.stdout
    if stream is None or isinstance(stream, _PipeSafe):
        yield
        return
    safe = _PipeSafe(stream)
    handlers = [
        h
        for h in logging.getLogger().handlers
        if isinstance(h, logging.StreamHandler) and getattr(h, "stream", None) is stream
    ]
    sys.stdout = safe  # type: ignore[assignment]
    for handler in handlers:
        handler.stream = safe
    try:
        yield
    finally:
        if sys.stdout is safe:
            sys.stdout = stream
        for handler in handlers:
            if handler.stream is safe:
                handler.stream = stream


def to_log_files(message: str, level: int = logging.INFO) -> None:
    """Write ``message`` to the job's log files alone (Hydra's ``art_hydra.log``: every
    file handler of the root logger), not to the console."""
    record = logging.LogRecord("art_hydra", level, __file__, 0, message, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            with contextlib.suppress(Exception):
                handler.handle(record)


class PlainProgress:
    """The run's plain progress lines (reads ``cfg.logging``): printed to stdout when
    ``print_lines`` (no bar shows), always written to the log files."""

    def __init__(
        self, logging_cfg: LoggingConfig, max_steps: int, start_step: int, print_lines: bool
    ) -> None:
        self.every_steps = int(logging_cfg.progress_every_steps)
        self.every_s = float(logging_cfg.progress_every_s)
        self.max_steps = max_steps
        self.start_step = start_step
        self.print_lines = print_lines
        self._started = time.monotonic()
        self._last: float | None = None

    def update(self, record: dict[str, Any]) -> str | None:
        """Report ``record``'s step if one is due; returns the line written (or None)."""
        now = time.monotonic()
        step = int(record["step"])
        due = progress_due(
            step,
            first_step=self.start_step + 1,
            max_steps=self.max_steps,
            every_steps=self.every_steps,
            every_s=self.every_s,
            since_last_s=None if self._last is None else now - self._last,
        )
        if not due:
            return None
        self._last = now
        line = progress_line(record, self.max_steps, now - self._started, step - self.start_step)
        if self.print_lines:
            with contextlib.suppress(OSError):  # a closed stdout: the log file still has it
                print(line, file=sys.stdout, flush=True)
        to_log_files(line)
        return line
