"""The training engine on the default run: queue overhead, RL tokens/s, packing share.

Measured in one process on the default config (tiny model, reverse task, 128
completions per step), interleaved so machine load affects both sides alike:

1. queue overhead: the protocol's own cost per step (a put and a result through the
   channel, with a trainer that does nothing) as a share of a real train step, and
   the same real train step through the queue against calling it directly (paired,
   median of per-pair ratios; noisier, since it includes the step's own jitter).
   Target: <= 2% of the step time.
2. tokens/s of a whole RL step (rollouts + rewards + packing + train step).
3. real-token share of the packed inputs. Target: >= 90%.

Usage: python bench/engine.py [--steps 30]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

from art_hydra import compose
from art_hydra.engine.queue import StepChannel, StepWork
from art_hydra.engine.recipe import build_trainer_and_producer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()

    cfg = compose(["logging.progress_bar=off"])
    trainer, producer = build_trainer_and_producer(cfg)

    # Whole RL steps: rollouts + train, through the queue as a run does it.
    channel = StepChannel(cfg.queue, trainer.train_step, cfg.timeouts.step_s)
    step_times, tokens, shares, inputs = [], [], [], []
    for step in range(1, args.steps + 1):
        start = time.perf_counter()
        (batch,) = channel.run_on_trainer_thread(producer.make_inputs, "making the inputs", 600)
        inputs.append(copy.deepcopy(batch))
        channel.put(StepWork([batch]))
        result = channel.result(step)
        step_times.append(time.perf_counter() - start)
        tokens.append(result.trained_tokens)
        shares.append(batch.real_token_share)

    # The same train steps, via the queue and called directly, alternating.
    queued, direct = [], []
    for i, batch in enumerate(inputs):
        for mode in ("queue", "direct") if i % 2 == 0 else ("direct", "queue"):
            item = StepWork([copy.deepcopy(batch)])
            start = time.perf_counter()
            if mode == "queue":
                channel.put(item)
                channel.result(i)
                queued.append(time.perf_counter() - start)
            else:
                trainer.train_step(item)
                direct.append(time.perf_counter() - start)
    channel.close()

    # The protocol alone: round trips through a channel whose trainer does nothing.
    echo = StepChannel(cfg.queue, lambda item: item, cfg.timeouts.step_s)
    trips = []
    for i in range(500):
        start = time.perf_counter()
        echo.put(i)
        echo.result(i)
        trips.append(time.perf_counter() - start)
    echo.close()

    q, d = statistics.median(queued), statistics.median(direct)
    trip = statistics.median(trips)
    paired = statistics.median(a / b for a, b in zip(queued, direct, strict=True))
    overhead = trip / d * 100
    print(
        f"default run, {args.steps} steps of {cfg.trainer.per_device_train_batch_size} "
        "completions (medians)"
    )
    print(f"train step direct:        {d * 1e3:7.2f} ms")
    print(f"train step via the queue: {q * 1e3:7.2f} ms  (paired ratio {paired:.3f})")
    print(
        f"queue round trip alone:   {trip * 1e3:7.3f} ms  -> overhead {overhead:.2f}% of the "
        f"step ({'meets' if overhead <= 2 else 'MISSES'} the 2% target)"
    )
    rl_step = statistics.median(step_times)
    rate = statistics.median(t / s for t, s in zip(tokens, step_times, strict=True))
    print(f"RL step (rollouts + train): {rl_step * 1e3:7.2f} ms, {rate:,.0f} trained tokens/s")
    share = statistics.mean(shares)
    print(
        f"real-token share of packed inputs: mean {share:.3f}, min {min(shares):.3f} "
        f"({'meets' if share >= 0.9 else 'MISSES'} the 90% target)"
    )


if __name__ == "__main__":
    main()
