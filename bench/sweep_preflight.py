"""Pre-flight cost per sweep point, next to Hydra's own composition of the same points.

Hydra's basic sweeper already composes every point in the parent before launching
(``validate_batch_is_legal``), but runs no validators. The pre-flight sweeper replaces
that step with compose + structural checks + every validator. This script times both
on the same points, with the same config loader and master config, interleaved, and
prints the per-point medians and their ratio. Target: pre-flight <= 1.15x Hydra.

Usage: python bench/sweep_preflight.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from hydra.types import HydraContext, RunMode

from art_hydra.config.composition import CONFIG_NAME, make_loader
from art_hydra.config.problems import errors

SWEEP = [
    "trainer.learning_rate=1e-4,3e-4,1e-3",
    "rl.num_generations=4,8,16",
    "algorithm=rl,sft",
    "seed=1,2",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()

    from hydra._internal.callbacks import Callbacks

    loader = make_loader()  # runs Hydra's plugin scan, which re-executes plugin modules
    from hydra_plugins.art_hydra_preflight.preflight_sweeper import PreflightSweeper

    master = loader.load_configuration(CONFIG_NAME, SWEEP, run_mode=RunMode.MULTIRUN)
    sweeper = PreflightSweeper()
    sweeper.config = master
    sweeper.hydra_context = HydraContext(config_loader=loader, callbacks=Callbacks())
    points = sweeper.points(SWEEP)
    assert not any(errors(p) for p in sweeper.preflight(points)), "points must be valid"

    def timed(fn) -> float:
        gc.collect()
        gc.disable()  # a collection landing in one side only would swamp the difference
        try:
            start = time.perf_counter()
            fn(points)
            return (time.perf_counter() - start) / len(points)
        finally:
            gc.enable()

    hydra_s: list[float] = []
    ours_s: list[float] = []
    for i in range(args.repeats):
        # Alternate which side goes first, so warm caches favour neither.
        if i % 2:
            ours_s.append(timed(sweeper.preflight))
            hydra_s.append(timed(sweeper.validate_batch_is_legal))
        else:
            hydra_s.append(timed(sweeper.validate_batch_is_legal))
            ours_s.append(timed(sweeper.preflight))

    hydra_ms, ours_ms = statistics.median(hydra_s) * 1e3, statistics.median(ours_s) * 1e3
    ratio = ours_ms / hydra_ms
    print(f"sweep points: {len(points)}, repeats: {args.repeats} (medians per point)")
    print(f"Hydra compose only (validate_batch_is_legal): {hydra_ms:6.2f} ms/point")
    print(f"art_hydra pre-flight (compose + checks):      {ours_ms:6.2f} ms/point")
    verdict = "meets" if ratio <= 1.15 else "MISSES"
    print(f"pre-flight / Hydra compose = {ratio:.3f}x ({verdict} the 1.15x target)")


if __name__ == "__main__":
    main()
