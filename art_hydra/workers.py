"""Background threads for bounded work, and a bounded wait for them at exit.

Work that may overrun its bound (a training step, a checkpoint write, a user's reward)
runs in a daemon thread, so the run can stop without it. A thread that is still inside
native code (a torch kernel, a safetensors write) when the interpreter finalizes can
abort the process, so at exit the process first gives such threads a bounded time to
finish; the CLI, which knows the exit status, leaves at once instead when one is stuck.
"""

from __future__ import annotations

import atexit
import threading
import time
from collections.abc import Callable

#: Name prefix of art_hydra's worker threads.
PREFIX = "art-hydra-"
#: The longest the process waits at exit for workers still running (seconds).
EXIT_GRACE_S = 10.0


def start(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` in a daemon worker thread named ``art-hydra-<name>``."""
    thread = threading.Thread(target=target, name=f"{PREFIX}{name}", daemon=True)
    thread.start()
    return thread


def running() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(PREFIX) and t.is_alive()]


@atexit.register
def _let_workers_finish() -> None:
    deadline = time.monotonic() + EXIT_GRACE_S
    for thread in running():
        thread.join(max(0.0, deadline - time.monotonic()))
