"""A word at start-up when the CPU a run trains on is already busy.

torch computes on the CPU with one thread per core by default. Every parallel op then
waits for its slowest thread, and on a machine whose cores other work keeps busy the OS
puts some of those threads aside: each op stalls on them. Measured side by side
(bench/busy_cpu.py, docs/benchmarks.md "Busy CPU"), the default job's steps ran
:data:`MEASURED_SLOWDOWN` times slower with the default thread count than with
``backend.cpu_threads=1`` on a busy machine, and about as fast on an idle one. The tool
does not change the setting on its own (the thread count changes the order of float
sums, so a run would no longer be bit-identical to one with another count): it says so
once, with the fix and its cost, when the load average at start-up is at least half the
usable cores and the user left ``backend.cpu_threads`` unset.

The decision is a pure function of the load, the cores, the setting and the device.
"""

from __future__ import annotations

import os

from art_hydra import moved

log = moved.logger(__name__)  # the name it logged under before the move

#: How many times slower the default job's steps were with torch's default thread count
#: than with ``backend.cpu_threads=1`` on a busy machine, measured side by side: 15x in
#: the issue that asked for this warning (60 steps, 70 s against 4.6 s), 25.7x with
#: bench/busy_cpu.py beside one busy-loop process per core (2 cores, docs/benchmarks.md).
MEASURED_SLOWDOWN = "15-26"


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask: a cgroup, taskset or a
    SLURM allocation gives fewer than the machine has)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def cpu_is_busy(load: float, cores: int, threads: int | None, device: str) -> bool:
    """Whether to warn: training on the CPU, ``backend.cpu_threads`` unset (torch's
    default: one thread per core) and a load average of at least half the usable cores."""
    return device == "cpu" and threads is None and load >= cores / 2


def busy_message(load: float, cores: int) -> str:
    """The warning's text: what was seen, what it costs, the fix and the fix's cost."""
    return (
        f"the CPU is already busy: load average {load:.2f} on {cores} usable core(s). With "
        f"torch's default thread count (one per core) the default job's steps ran about "
        f"{MEASURED_SLOWDOWN}x slower than with backend.cpu_threads=1 on a busy machine "
        "(bench/busy_cpu.py). Fix: add backend.cpu_threads=1 to the command. Its cost: the "
        "thread count changes the order of float sums, so the results are not bit-identical "
        "to runs with another thread count, and a resume must keep the same value to stay "
        "bit-exact."
    )


def warn_if_busy(
    device: str,
    threads: int | None,
    load: float | None = None,
    cores: int | None = None,
) -> str | None:
    """Log the busy-CPU warning when :func:`cpu_is_busy` (the load read from
    ``os.getloadavg`` and the cores from the affinity mask unless given); returns the
    message logged, or None. Call once per run, on rank 0."""
    if device != "cpu" or threads is not None:
        return None
    if load is None:
        try:
            load = os.getloadavg()[0]
        except OSError:  # no load average on this system
            return None
    cores = usable_cores() if cores is None else cores
    if not cpu_is_busy(load, cores, threads, device):
        return None
    message = busy_message(load, cores)
    log.warning("%s", message)
    return message
