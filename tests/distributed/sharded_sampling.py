"""Under torchrun, sharded (distributed.strategy=fsdp): rank 0 samples a one-token
completion and rank 1 a forty-token one from the run's rollout engine, then both take a
training step and refresh the sampler (collectives). A sampler that ran sharded forwards
would leave rank 1 waiting for rank 0's missing gathers. Each rank writes its longest
completion to ``argv[1]/rank{N}.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from art_hydra import compose
from art_hydra.engine import distributed as dist_setup
from art_hydra.engine.queue import StepWork
from art_hydra.engine.ranks import coordinator_for
from art_hydra.engine.recipe import build_run_parts
from art_hydra.engine.rollout.base import Request


def main() -> None:
    cfg = compose(["distributed.strategy=fsdp", "trainer.per_device_train_batch_size=8"])
    world = dist_setup.setup(cfg.distributed, torch.device("cpu"))
    parts = build_run_parts(cfg, world)
    engine, producer = parts.producer.engine, parts.producer
    budget = 1 if world.rank == 0 else 40
    prompt = tuple(parts.trainer.loaded.tokenizer.encode("abc="))
    done = engine.generate(
        [Request(prompt, budget, ())] * 2, producer.sampling, producer.generator, timeout_s=60
    )
    longest = max(len(c.token_ids) for c in done)
    producer.step = 1
    inputs = producer.make_inputs()
    coordinator_for(world, cfg.distributed.timeout_s, 0.0, 0.0).normalise(inputs)
    parts.trainer.train_step(StepWork(inputs))
    producer.refresh_sampler()
    Path(sys.argv[1], f"rank{world.rank}.json").write_text(json.dumps({"longest": longest}))
    dist_setup.teardown(world)


if __name__ == "__main__":
    main()
