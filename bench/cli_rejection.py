"""How fast does the CLI reject a bad config, next to merely importing Hydra?

Runs, interleaved in one process tree so that machine load affects all alike:
  A) python -c "import hydra, omegaconf"             (the floor any Hydra CLI pays)
  B) art-hydra trainer.gradient_accumulation_steps=2  (RL + accumulation: rejected)
  C) art-hydra trainer.learning_rate=abc +trainer.lerning_rate=1 algorithm=foo
     (three override errors, found by the diagnosis path)
and prints the medians and the ratios B/A and C/A. Target: B/A <= 2.5.

Usage: python bench/cli_rejection.py [--repeats 9]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "import hydra, omegaconf": [sys.executable, "-c", "import hydra, omegaconf"],
    "art-hydra reject (validator)": [
        sys.executable,
        "-m",
        "art_hydra",
        "trainer.gradient_accumulation_steps=2",
    ],
    "art-hydra reject (3 bad overrides)": [
        sys.executable,
        "-m",
        "art_hydra",
        "trainer.learning_rate=abc",
        "+trainer.lerning_rate=1",
        "algorithm=foo",
    ],
}


def run_once(cmd: list[str], cwd: str) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    rejected = proc.returncode == 1 and "The configuration cannot run" in proc.stderr
    if "import" not in cmd[-1] and (not rejected or "Traceback" in proc.stderr):
        raise SystemExit(f"expected a clean rejection from {cmd}, got:\n{proc.stderr}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args()
    env_cwd = tempfile.mkdtemp(prefix="art_hydra_bench_")
    times: dict[str, list[float]] = {name: [] for name in CASES}
    for cmd in CASES.values():  # warm the file cache once
        run_once(cmd, env_cwd)
    for _ in range(args.repeats):
        for name, cmd in CASES.items():
            times[name].append(run_once(cmd, env_cwd))
    base = statistics.median(times["import hydra, omegaconf"])
    print(f"cpu cores: {os.cpu_count()}, repeats: {args.repeats} (medians)")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:38s} {med * 1000:7.1f} ms   {med / base:5.2f}x the bare import")
    ratio = statistics.median(times["art-hydra reject (validator)"]) / base
    verdict = "meets" if ratio <= 2.5 else "MISSES"
    print(f"rejection / bare import = {ratio:.2f}x ({verdict} the 2.5x target)")


if __name__ == "__main__":
    main()
