"""The rank coordinator on this process's ranks (gloo, CPU): each rank normalises,
combines a step's metrics, agrees on a stop, gathers producer states and passes both
barriers; rank 0 writes what it got to the JSON file named by argv[1]. Rank 1 alone is
"signalled", so rank 0 stops only through the agreement."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import torch

from art_hydra import compose
from art_hydra.engine import distributed as dist_setup
from art_hydra.engine.ranks import coordinator_for


def main() -> None:
    cfg = compose([])
    world = dist_setup.setup(cfg.distributed, torch.device("cpu"))
    ranks = coordinator_for(world, cfg.distributed.timeout_s, 5.0, cfg.timeouts.checkpoint_s)
    r = world.rank
    inputs = [SimpleNamespace(step_loss_tokens=10.0 * (r + 1)) for _ in range(2)]
    ranks.inputs_barrier("waiting for the other ranks' inputs of step 1")
    ranks.normalise(inputs)
    result = SimpleNamespace(
        info={"completions": 4.0}, loss_tokens=10 * (r + 1), trained_tokens=20, stats={}
    )
    last = {
        "reward_mean": float(r),
        "reward_std": 0.0,
        "zero_std_groups": 1.0,
        "completion_length": 3.0,
        "loss": 1.0 + r,
        "kl": 0.0,
        "entropy": 1.0,
        "clip_fraction": 0.0,
        "real_token_share": 0.5,
        "tokens_per_s": 10.0,
        "step_time_s": 2.0,
    }
    stop = SimpleNamespace(requested=r == 1, agreed=False)
    before = ranks.stopping(stop)
    line = ranks.combine(result, last, stop)
    producer = SimpleNamespace(state_dict=lambda: ({}, {"rank": r}))
    gathered = ranks.gather_producer_states(producer)
    ranks.checkpoint_barrier(1)
    if ranks.writes_records:
        found = {
            "size": world.size,
            "denominators": [i.step_loss_tokens for i in inputs],
            "reward_mean": line["reward_mean"],
            "loss": line["loss"],
            "stopping_before": before,
            "stopping_after": ranks.stopping(stop),
            "gathered": [plain for _, plain in gathered],
        }
        with open(sys.argv[1], "w") as out:
            json.dump(found, out)
    dist_setup.teardown(world)


if __name__ == "__main__":
    main()
