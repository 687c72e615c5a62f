"""Overlapped rollouts against the synchronous loop on the default work, interleaved.

Runs the default RL job with and without ``rl.overlap_rollouts=true`` on each seed, in
fresh processes, alternating, and prints per mode the steady optimizer steps/s (median
step time past the first 20% of steps), the step at which the mean reward over 5 steps
first reaches 0.9, the training seconds to that step (the sum of the step times up to
it) and the final reward, then the ratios overlap / synchronous.

Usage: python bench/overlap.py [--seeds 0,1,2] [--steps 300]
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

from runs import QUIET, step_reaching_target

BIN = Path(sys.executable).parent
MODES = {"synchronous": [], "overlap": ["rl.overlap_rollouts=true"]}


def run(extra: list[str], seed: int, steps: int, folder: Path) -> dict[str, float | None]:
    cmd = [str(BIN / "art-hydra"), f"seed={seed}", f"trainer.max_steps={steps}", *QUIET]
    cmd += [*extra, f"hydra.run.dir={folder}"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    rewards = [r["reward_mean"] for r in rows]
    hit = step_reaching_target(rewards)
    return {
        "steps_per_s": 1 / statistics.median(r["step_time_s"] for r in rows[len(rows) // 5 :]),
        "target_step": hit,
        "target_s": sum(r["step_time_s"] for r in rows[:hit]) if hit else None,
        "final_reward": sum(rewards[-10:]) / 10,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    results: dict[str, list[dict]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for i, seed in enumerate(seeds):
            order = list(MODES) if i % 2 == 0 else list(reversed(MODES))
            for mode in order:
                r = run(MODES[mode], seed, args.steps, Path(tmp) / f"{mode}-{seed}")
                results[mode].append(r)
                print(f"seed {seed} {mode:>11}: {json.dumps(r)}", flush=True)
    print(f"cpu cores: {os.cpu_count()}, seeds {args.seeds}, {args.steps} steps (medians)")
    for key, label in (
        ("steps_per_s", "steady steps/s"),
        ("target_step", "step reaching reward 0.9 (5-step mean)"),
        ("target_s", "training seconds to that step"),
        ("final_reward", "mean reward, last 10 steps"),
    ):
        values = {}
        for mode in MODES:
            got = [r[key] for r in results[mode] if r[key] is not None]
            values[mode] = statistics.median(got) if got else None
            missed = len(results[mode]) - len(got)
            values[mode + "_missed"] = missed
        s, o = values["synchronous"], values["overlap"]
        ratio = f"{o / s:.2f}x" if s and o else "-"
        note = "".join(
            f" ({values[m + '_missed']} run(s) of {m} never reached it)"
            for m in MODES
            if values[m + "_missed"]
        )
        print(
            f"{label:42} sync {s if s is None else round(s, 3)!s:>8}  overlap "
            f"{o if o is None else round(o, 3)!s:>8}  ratio {ratio}{note}"
        )


if __name__ == "__main__":
    main()
