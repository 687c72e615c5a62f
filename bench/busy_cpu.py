"""How much does torch's default thread count cost on a busy CPU, next to one thread?

Trains the default job (the tiny model, RL) for a few steps in fresh processes, side by
side in one run, four ways:
  A) backend.cpu_threads=null (torch's default: one thread per core), idle machine
  B) backend.cpu_threads=1, idle machine
  C) A with N busy-loop burner processes (N = usable cores, the machine made busy)
  D) B with the same burners
and prints each one's training time (the sum of step_time_s in metrics.jsonl, so start-up
is not counted), the load average seen, and the ratios A/B and C/D: the second is what
the start-up warning of art_hydra/engine/cpu_load.py quotes. The cases alternate over the
repeats so drifting load affects all alike.

Usage: python bench/busy_cpu.py [--steps 10] [--repeats 2] [--burners N]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _burn() -> None:
    """A busy loop: one core's worth of other work."""
    while True:
        pass


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def train_seconds(threads: str, steps: int, root: Path) -> float:
    """Seconds the run's steps took (sum of step_time_s) with backend.cpu_threads=threads."""
    run = Path(tempfile.mkdtemp(prefix="busy_", dir=root))
    cmd = [
        sys.executable,
        "-m",
        "art_hydra",
        f"trainer.max_steps={steps}",
        f"backend.cpu_threads={threads}",
        "checkpoint.every_steps=0",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return sum(json.loads(line)["step_time_s"] for line in lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--burners", type=int, default=usable_cores())
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="art_hydra_busy_"))
    cases = {"default threads": "null", "cpu_threads=1": "1"}
    times: dict[str, list[float]] = {}
    loads: dict[str, list[float]] = {"idle": [], "busy": []}
    for _ in range(args.repeats):
        for phase in ("idle", "busy"):
            burners = []
            if phase == "busy":
                burners = [multiprocessing.Process(target=_burn) for _ in range(args.burners)]
                for b in burners:
                    b.start()
                time.sleep(2)  # let the burners take their cores
            try:
                for name, threads in cases.items():
                    times.setdefault(f"{phase}, {name}", []).append(
                        train_seconds(threads, args.steps, root)
                    )
                    loads[phase].append(os.getloadavg()[0])
            finally:
                for b in burners:
                    b.terminate()
                    b.join()
            if phase == "busy":
                time.sleep(2)
    print(
        f"usable cores: {usable_cores()}, burners: {args.burners}, steps per run: "
        f"{args.steps}, repeats: {args.repeats} (medians of the summed step times)"
    )
    for phase, seen in loads.items():
        print(f"load average (1 min) during the {phase} runs: {statistics.median(seen):.2f}")
    med = {name: statistics.median(values) for name, values in times.items()}
    for name, value in med.items():
        print(f"{name:32s} {value:8.2f} s  ({value / args.steps:.3f} s/step)")
    for phase in ("idle", "busy"):
        ratio = med[f"{phase}, default threads"] / med[f"{phase}, cpu_threads=1"]
        print(f"{phase}: default threads / cpu_threads=1 = {ratio:.1f}x")


if __name__ == "__main__":
    main()
