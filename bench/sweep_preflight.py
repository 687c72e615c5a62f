"""Pre-flight cost per sweep point at 10, 100 and 1,000 points, beside Hydra's own
per-point composition of the same points.

Hydra's basic sweeper composes every point in the parent before launching
(``validate_batch_is_legal``: composition only, no checks). art_hydra's pre-flight
composes, checks every field, every validator and the world (task, model, backend, run
folder) for each point, through :class:`art_hydra.sweeps.preflight.PointChecker`, which
composes once per group selection. Both sides run on the same points, in one process,
alternating which goes first; the script prints per-point medians, their ratio and the
wall time of the whole pre-flight. Goal: 1,000 points in at most 5 s.

``--baseline DIR`` compares with another checkout instead (``DIR`` first on the path, as
``PYTHONPATH=DIR`` does): each side runs each grid in a fresh process (no cache carried
over), the two sides alternating which goes first; it prints both sides' per-point
medians and their ratio.

Usage: python bench/sweep_preflight.py [--repeats 3] [--sizes 10 100 1000] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from tempfile import TemporaryDirectory

from hydra.types import HydraContext, RunMode

from art_hydra.config.composition import CONFIG_NAME, make_loader
from art_hydra.config.problems import errors

#: Two grids of 1,000 points. "values": hyperparameters and one group (2 x 5 x 10 x 10);
#: "seeds": 1,000 seeds, each its own generated data, which the pre-flight checks per
#: seed (the task's examples are drawn from the seed).
GRIDS = {
    "values": [
        ["algorithm=rl", "algorithm=sft"],
        [f"trainer.learning_rate={v}" for v in (1e-4, 2e-4, 3e-4, 5e-4, 1e-3)],
        [f"trainer.warmup_steps={w}" for w in range(10)],
        [f"rl.temperature={t}" for t in (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5)],
    ],
    "seeds": [[f"seed={s}" for s in range(1000)]],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--grids", nargs="+", default=list(GRIDS), choices=list(GRIDS))
    parser.add_argument("--baseline", help="another checkout to compare with, side by side")
    parser.add_argument("--one", nargs=2, metavar=("GRID", "SIZE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(_one(args.one[0], int(args.one[1])))
        return
    if args.baseline:
        _against(args.baseline, args)
        return

    from hydra._internal.callbacks import Callbacks

    loader = make_loader()  # runs Hydra's plugin scan, which re-executes plugin modules
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    from hydra_plugins.art_hydra_preflight.preflight_sweeper import PreflightSweeper

    hydra_loader = ConfigLoaderImpl(config_search_path=loader.config_search_path)
    with TemporaryDirectory() as tmp:
        sweep_dir = f"hydra.sweep.dir={Path(tmp) / 'sweep'}"
        master = loader.load_configuration(CONFIG_NAME, [sweep_dir], run_mode=RunMode.MULTIRUN)
        print(
            f"{'grid':>7} {'points':>7} {'Hydra compose':>15} {'pre-flight':>12} {'ratio':>7} "
            f"{'whole':>9}"
        )
        for grid, size in itertools.product(args.grids, args.sizes):
            points = [list(p) for p in itertools.product(*GRIDS[grid])][:size]

            def ours(points: list[list[str]] = points) -> None:
                sweeper = PreflightSweeper()  # fresh: no cache carried between repeats
                sweeper.config = master
                sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=Callbacks())
                found = sweeper.preflight(points)
                assert not any(errors(p) for p in found), "the benchmark's points must be valid"

            def hydra(points: list[list[str]] = points) -> None:
                sweeper = PreflightSweeper()
                sweeper.config = master
                sweeper.hydra_context = HydraContext(
                    config_loader=hydra_loader, callbacks=Callbacks()
                )
                sweeper.validate_batch_is_legal(points)

            ours_s, hydra_s = [], []
            for i in range(args.repeats):
                pair = [(ours, ours_s), (hydra, hydra_s)]
                for fn, into in pair if i % 2 == 0 else reversed(pair):
                    gc.collect()
                    start = time.perf_counter()
                    fn()
                    into.append(time.perf_counter() - start)
            ours_t, hydra_t = statistics.median(ours_s), statistics.median(hydra_s)
            print(
                f"{grid:>7} {size:>7} {hydra_t / size * 1e3:>12.2f} ms "
                f"{ours_t / size * 1e3:>9.2f} ms {ours_t / hydra_t:>6.2f}x {ours_t:>7.2f} s"
            )
    print("pre-flight: compose + structure + bounds + validators + world, per point")


def _one(grid: str, size: int) -> float:
    """Seconds of one pre-flight of the grid's first ``size`` points, in a fresh process."""
    from hydra._internal.callbacks import Callbacks

    loader = make_loader()
    from hydra_plugins.art_hydra_preflight.preflight_sweeper import PreflightSweeper

    points = [list(p) for p in itertools.product(*GRIDS[grid])][:size]
    with TemporaryDirectory() as tmp:
        sweep_dir = f"hydra.sweep.dir={Path(tmp) / 'sweep'}"
        master = loader.load_configuration(CONFIG_NAME, [sweep_dir], run_mode=RunMode.MULTIRUN)
        sweeper = PreflightSweeper()
        sweeper.config = master
        sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=Callbacks())
        start = time.perf_counter()
        found = sweeper.preflight(points)
        took = time.perf_counter() - start
    assert not any(errors(p) for p in found), "the benchmark's points must be valid"
    return took


def _side(path: str | None, grid: str, size: int) -> float:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    command = [sys.executable, __file__, "--one", grid, str(size)]
    out = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def _against(baseline: str, args: argparse.Namespace) -> None:
    """This checkout beside ``baseline``, each run in its own process, alternating."""
    print(f"{'grid':>7} {'points':>7} {'baseline':>12} {'this':>10} {'ratio':>7}")
    for grid, size in itertools.product(args.grids, args.sizes):
        times: dict[str | None, list[float]] = {baseline: [], None: []}
        for i in range(args.repeats):
            for side in [baseline, None] if i % 2 == 0 else [None, baseline]:
                times[side].append(_side(side, grid, size))
        base_t, this_t = (statistics.median(times[s]) for s in (baseline, None))
        print(
            f"{grid:>7} {size:>7} {base_t / size * 1e3:>9.2f} ms {this_t / size * 1e3:>7.2f} ms "
            f"{base_t / this_t:>6.2f}x",
            flush=True,
        )
    print(f"baseline: {baseline}; per-point medians of {args.repeats} fresh processes a side")


if __name__ == "__main__":
    main()
