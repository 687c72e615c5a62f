"""One optimizer step's gradient, from a fixed global batch, on this process's ranks.

Run alone (world of 1) it computes the gradient of the whole global batch; under
torchrun with N ranks each rank takes its 1/N of the sequences and DDP averages the
gradients. Rank 0 writes the gradient to the file named by argv[1].
"""

from __future__ import annotations

import sys

import torch
from safetensors.torch import save_file

from art_hydra import compose
from art_hydra.engine import distributed as dist_setup
from art_hydra.engine.backends import load_model
from art_hydra.engine.packing import Sequence, pack
from art_hydra.engine.ranks import coordinator_for
from art_hydra.engine.rl.sampling import SamplingSettings
from art_hydra.engine.trainer import Trainer, TrainingLoss
from art_hydra.tasks import build_task

GLOBAL_SEQUENCES = 16


def global_batch(vocab: int) -> list[Sequence]:
    """The same sequences on every rank: prompts, completions, advantages, old logprobs."""
    gen = torch.Generator().manual_seed(1234)
    out = []
    for i in range(GLOBAL_SEQUENCES):
        prompt, completion = 3 + i % 3, 2 + (i * 5) % 7  # different lengths, so packing varies
        tokens = torch.randint(4, vocab, (prompt + completion,), generator=gen).tolist()
        old = (-torch.rand(completion, generator=gen) * 3).tolist()
        advantage = float(torch.randn((), generator=gen))
        out.append(Sequence(tokens, prompt, advantage=advantage, old_logprobs=old))
    return out


def main() -> None:
    # Further overrides (argv[2:]), e.g. rl.loss_aggregation=grpo.
    cfg = compose(["trainer.per_device_train_batch_size=16", "rl.epsilon=0.2", *sys.argv[2:]])
    world = dist_setup.setup(cfg.distributed, torch.device("cpu"))
    task = build_task(cfg)
    loaded = load_model(cfg.model, cfg.backend, cfg.seed, charset=task.charset())
    sampling = SamplingSettings.from_config(cfg.rl)
    trainer = Trainer(loaded, cfg.trainer, TrainingLoss.for_rl(cfg.rl, sampling), world)
    sequences = global_batch(len(loaded.tokenizer))
    share = len(sequences) // world.size
    mine = sequences[world.rank * share : (world.rank + 1) * share]
    batch = pack(mine, cfg.model.max_seq_length, loaded.tokenizer.pad_token_id, loaded.layout)
    batch.step_loss_tokens = batch.loss_tokens
    timeouts = cfg.timeouts
    ranks = coordinator_for(world, cfg.distributed.timeout_s, 0.0, timeouts.checkpoint_s)
    ranks.normalise([batch])  # a single process: its own count, unchanged
    trainer.model.train()
    loss, _ = trainer.loss(batch)
    loss.backward()
    if world.is_main:
        grads = {
            name: p.grad.detach().clone()
            for name, p in trainer.model.named_parameters()
            if p.grad is not None
        }
        save_file(grads, sys.argv[1])
    dist_setup.teardown(world)


if __name__ == "__main__":
    main()
