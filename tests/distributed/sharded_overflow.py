"""Under torchrun, sharded, float16: after a backward, rank 1 alone finds an infinite
gradient in its shard. Every rank must skip the optimizer step (a rank that stepped
would leave the shards out of step with each other). Each rank writes whether its
weights moved and the loss scale to ``argv[1]/rank{N}.json``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from art_hydra import compose
from art_hydra.engine import distributed as dist_setup
from art_hydra.engine.ranks import coordinator_for
from art_hydra.engine.recipe import build_run_parts


def main() -> None:
    cfg = compose(
        [
            "distributed.strategy=fsdp",
            "trainer.per_device_train_batch_size=8",
            "model.dtype=float16",
        ]
    )
    world = dist_setup.setup(cfg.distributed, torch.device("cpu"))
    parts = build_run_parts(cfg, world)
    trainer, producer = parts.trainer, parts.producer
    producer.step = 1
    inputs = producer.make_inputs()
    coordinator_for(world, cfg.distributed.timeout_s, 0.0, 0.0).normalise(inputs)
    trainer.model.train()
    trainer._backward(inputs[0], sync=True)
    before = [p.to_local().detach().clone() for p in trainer.model.parameters()]
    if world.rank == 1:
        grad = next(p.grad for p in trainer.model.parameters() if p.grad is not None)
        grad.to_local().view(-1)[0] = float("inf")
    scale = trainer.scaler.get_scale()
    _, skipped = trainer._apply_gradients()
    after = [p.to_local() for p in trainer.model.parameters()]
    moved = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    found = {"skipped": skipped, "moved": moved, "scale": [scale, trainer.scaler.get_scale()]}
    Path(sys.argv[1], f"rank{world.rank}.json").write_text(json.dumps(found))
    dist_setup.teardown(world)


if __name__ == "__main__":
    main()
