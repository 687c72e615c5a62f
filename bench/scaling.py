"""Data-parallel scaling: steps/s and trained tokens/s on 1 and 2 ranks, interleaved.

Runs the default RL job (tiny model, reverse task) with the same per-rank batch on one
process and on 2 ranks under torchrun (gloo on the CPU, NCCL on GPUs where a machine has
them), alternating, and reads each run's own per-step timings from its metrics. Prints
the medians over the steady steps and the scaling efficiency: trained tokens/s on N
ranks over N times the single rank's (1.0 = perfect weak scaling). A global batch of the
same size (strong scaling) is printed too.

Usage: python bench/scaling.py [--steps 60] [--repeats 2] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from runs import QUIET

BIN = Path(sys.executable).parent


def run(ranks: int, batch: int, steps: int, folder: Path) -> tuple[float, float]:
    """Median steps/s and trained tokens/s over the steady steps of one run."""
    args = [f"trainer.per_device_train_batch_size={batch}", f"trainer.max_steps={steps}"]
    args += [*QUIET, f"hydra.run.dir={folder}"]
    if ranks == 1:
        cmd = [str(BIN / "art-hydra"), *args]
    else:
        cmd = [str(BIN / "torchrun"), "--standalone", f"--nproc_per_node={ranks}", "-m"]
        cmd += ["art_hydra", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steady = rows[len(rows) // 5 :]  # past the first steps (allocation, caches)
    return (
        1.0 / statistics.median(r["step_time_s"] for r in steady),
        statistics.median(r["tokens_per_s"] for r in steady),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64, help="completions per rank per step")
    args = parser.parse_args()
    sides = {
        "1 rank": (1, args.batch),
        "2 ranks": (2, args.batch),
        "2 ranks, same global batch": (2, args.batch // 2),
    }
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in sides}
    with tempfile.TemporaryDirectory(prefix="art_hydra_scaling_") as tmp:
        for repeat in range(args.repeats):
            for name, (ranks, batch) in sides.items():
                folder = Path(tmp) / f"{repeat}-{ranks}-{batch}"
                results[name].append(run(ranks, batch, args.steps, folder))
    print(f"cpu cores: {os.cpu_count()}, {args.steps} steps, {args.repeats} runs each (medians)")
    summary = {}
    for name, samples in results.items():
        steps_s = statistics.median(s for s, _ in samples)
        tokens_s = statistics.median(t for _, t in samples)
        summary[name] = (steps_s, tokens_s)
        ranks, batch = sides[name]
        print(
            f"{name:28s} ({ranks} x {batch:3d} completions): {steps_s:6.2f} steps/s, "
            f"{tokens_s:9.0f} trained tokens/s"
        )
    one, two = summary["1 rank"][1], summary["2 ranks"][1]
    print(f"weak scaling efficiency (tokens/s, 2 ranks / (2 x 1 rank)) = {two / (2 * one):.2f}")
    strong = summary["2 ranks, same global batch"][0] / summary["1 rank"][0]
    print(f"strong scaling (steps/s at the same global batch, 2 ranks / 1 rank) = {strong:.2f}x")


if __name__ == "__main__":
    main()
