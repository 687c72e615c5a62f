"""The house's four speed figures, side by side in one run, printed as ratios.

1. RL steady optimizer steps/s against TRL's GRPOTrainer on identical work
   (``bench/vs_trl.py``'s work: one model folder, 2,000 examples, 128 completions a
   step; the sides alternate in fresh processes). Goal: at least 2.5x.
2. Refusing a config that cannot work against a bare ``import hydra, omegaconf``
   (``bench/cli_rejection.py``'s cases, interleaved, bytecode cached as an install has
   it). Goal: at most 2.0x. Beside it, for reference: a plain Hydra app composing a
   one-line config (what composing anything costs), art_hydra's config layer imported,
   and that plus Hydra composing the same config through its own ``compose`` API (no
   check, no report): the refusal's parts.
3. The sweep pre-flight per point at 1,000 points, for the values grid and the seed-only
   grid (``bench/sweep_preflight.py``, a fresh process each), against the 5 ms goal.
   Beside it, for reference, the default task's generator drawing one seed's examples:
   a seed-only grid's floor, since each seed's data differ and are checked.
4. With ``--suite``: ``make test`` (venvs present) against 15 minutes and
   ``pytest -m fast`` against 60 s. Off by default: it takes the suite's own time.

Each part lies in the script named beside it, which measures it at length; this one
runs them together so that one machine, one hour and one load stand behind all four.
Needs the ``bench`` extra (TRL): ``pip install -e '.[bench]'``.

Usage: python bench/speed_figures.py [--pairs 2] [--steps 200] [--repeats 5] [--suite]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cli_rejection
import sweep_preflight
import vs_trl

ROOT = Path(__file__).resolve().parent.parent


def steps_against_trl(pairs: int, steps: int) -> tuple[float, float]:
    """Median steady steps/s of art_hydra and of TRL, alternating in fresh processes."""
    args = argparse.Namespace(steps=steps, art=[], baseline=None, model="", data="")
    sides: dict[str, list[float]] = {"art": [], "trl": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model_dir, data = vs_trl.prepare(work)
        args.model, args.data = str(model_dir), str(data)
        for i in range(pairs):
            for side in ("art", "trl") if i % 2 == 0 else ("trl", "art"):
                sides[side].append(vs_trl.run_side(side, args, i, work)["steps_per_s"])
    return statistics.median(sides["art"]), statistics.median(sides["trl"])


def rejection_against_import(repeats: int) -> dict[str, float]:
    """Median CPU seconds (user + system), interleaved, of the bare import, the
    validator's refusal and its references: a plain Hydra app composing a one-line config,
    art_hydra's config layer imported, and that plus Hydra composing the same config (no
    check, no report). CPU time is what a loaded machine inflates least."""
    env = cli_rejection._environments(None)[""]
    cwd = tempfile.mkdtemp(prefix="art_hydra_bench_")
    cases = {
        name: cli_rejection.CASES[key]
        for name, key in (
            ("bare", "import hydra, omegaconf"),
            ("refusal", "art-hydra reject (validator)"),
            ("plain", "a plain Hydra app: compose a 1-line config"),
            ("layer", "import art_hydra.conf"),
            ("composed", "Hydra alone: compose, no checks"),
        )
    }
    for cmd in cases.values():  # warm the file and bytecode caches
        cli_rejection.run_once(cmd, cwd, env)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, cmd in cases.items():
            times[name].append(cli_rejection.run_once(cmd, cwd, env)[1])
    return {name: statistics.median(found) for name, found in times.items()}


def sweep_per_point(grid: str, points: int = 1000) -> float:
    """Milliseconds per point of one pre-flight of ``points`` points, in a fresh process."""
    return sweep_preflight._side(None, grid, points) / points * 1e3


def generator_per_seed(seeds: int = 100) -> float:
    """Milliseconds the default task's own generator takes to draw one seed's examples
    (``task.num_examples`` of them), in this process: the least a seed-only grid's
    pre-flight can cost a point while it checks each seed's data, which differ."""
    from art_hydra import compose
    from art_hydra.tasks.base import generate_examples, resolve_task_code

    task = compose([]).task
    generator = resolve_task_code(task, "task.generator")
    start = time.perf_counter()
    for seed in range(seeds):
        generate_examples(task, generator, seed)
    return (time.perf_counter() - start) / seeds * 1e3


def suite() -> tuple[float, float]:
    """Wall seconds of ``make test`` and of ``pytest -m fast`` in this checkout."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    took = []
    for cmd in (["make", "test"], [sys.executable, "-m", "pytest", "-m", "fast", "-q"]):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
        took.append(time.perf_counter() - start)
    return took[0], took[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="art_hydra/TRL run pairs")
    parser.add_argument("--steps", type=int, default=200, help="optimizer steps a run")
    parser.add_argument("--repeats", type=int, default=5, help="refusals timed")
    parser.add_argument("--suite", action="store_true", help="also time make test")
    args = parser.parse_args()
    print(f"cpu cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    art, trl = steps_against_trl(args.pairs, args.steps)
    rows.append(("RL steady steps/s, art_hydra / TRL", f"{art:.2f} / {trl:.2f}", art / trl, -2.5))
    cpu = rejection_against_import(args.repeats)
    bare = cpu["bare"]
    rows.append(
        (
            "refusal / import hydra, omegaconf (CPU s)",
            f"{cpu['refusal']:.3f} / {bare:.3f}",
            cpu["refusal"] / bare,
            2.0,
        )
    )
    for label, key in (
        ("a plain Hydra app, 1-line config", "plain"),
        ("art_hydra's config layer imported", "layer"),
        ("that + Hydra's compose, no check", "composed"),
    ):
        rows.append((f"  {label}", f"{cpu[key]:.3f}", cpu[key] / bare, 0))
    for grid in ("values", "seeds"):
        ms = sweep_per_point(grid)
        rows.append((f"sweep pre-flight, {grid} grid (ms/point)", f"{ms:.2f}", ms / 5.0, 1.0))
    drawn = generator_per_seed()
    rows.append(("  the task's generator alone, a seed (ms)", f"{drawn:.2f}", drawn / 5.0, 0))
    if args.suite:
        whole, fast = suite()
        rows.append(("make test (min) / 15 min", f"{whole / 60:.1f}", whole / 900, 1.0))
        rows.append(("pytest -m fast (s) / 60 s", f"{fast:.0f}", fast / 60, 1.0))
    print(f"\n{'figure':48} {'measured':>20} {'ratio':>8} {'goal':>9}")
    for name, measured, ratio, goal in rows:  # a negative goal: at least; 0: for reference
        if not goal:
            print(f"{name:48} {measured:>20} {ratio:>7.2f}x {'(ref)':>9}")
            continue
        met = ratio >= -goal if goal < 0 else ratio <= goal
        bound = f"{'>=' if goal < 0 else '<='}{abs(goal):.1f}x"
        print(f"{name:48} {measured:>20} {ratio:>7.2f}x {bound:>9} {'met' if met else 'MISSED'}")
    print("ratios: steps/s to TRL's; refusal to the bare import; per point to 5 ms; suite to goal")
    print("(ref): a reference for the figure above it, not a goal")


if __name__ == "__main__":
    main()
