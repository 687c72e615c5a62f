"""Training memory per rank under ``distributed.strategy=ddp`` and ``fsdp``, on 2 ranks.

Measured: the same RL step of a widened tiny model (hidden 512, 8 layers: about 34M
parameters; bfloat16 compute on float32 masters) on 2 CPU ranks under torchrun, once per
strategy. Each rank counts the bytes of the tensors it holds itself (a shard's local
part under FSDP): parameters, gradients (after the backward, before the optimizer step),
AdamW's moments (after the step), and the whole copies a rank keeps besides (the
sampler's copy under FSDP, the KL reference with ``rl.beta > 0``). Printed side by side
with the ratio fsdp/ddp.

Computed (marked so): the same four figures for released model sizes on 8 GPUs, from
the per-rank arithmetic the world pre-flight checks with
(:func:`art_hydra.preflight.rank_memory.per_rank`); only single-GPU machines are lent,
so multi-GPU figures are not measured here.

Usage: python bench/fsdp_memory.py [--hidden 512] [--layers 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
MIB = 2.0**20


def _local_bytes(tensor: object) -> int:
    from art_hydra.engine.sharding import is_sharded

    local = tensor.to_local() if is_sharded(tensor) else tensor  # type: ignore[attr-defined]
    return local.numel() * local.element_size()


def _unique(tensors: list[object]) -> list[object]:
    seen: dict[int, object] = {}
    for tensor in tensors:
        seen.setdefault(id(tensor), tensor)
    return list(seen.values())


def worker(out: Path, strategy: str, hidden: int, layers: int) -> None:
    """One rank (under torchrun): one RL step, counting what this rank holds."""
    import resource

    import torch

    from art_hydra import compose
    from art_hydra.engine import distributed as dist_setup
    from art_hydra.engine.ranks import coordinator_for
    from art_hydra.engine.recipe import build_run_parts

    cfg = compose(
        [
            f"distributed.strategy={strategy}",
            "trainer.per_device_train_batch_size=8",
            f"model.tiny.hidden_size={hidden}",
            f"model.tiny.num_layers={layers}",
            f"model.tiny.intermediate_size={hidden * 4}",
            "model.dtype=bfloat16",  # float32 masters, bfloat16 compute: as GPU runs train
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
    params = _unique(list(trainer.model.parameters()))
    grads = [p.grad for p in params if p.grad is not None]
    found = {
        "parameters": sum(_local_bytes(p) for p in params),
        "gradients": sum(_local_bytes(g) for g in grads),
    }
    trainer._apply_gradients()
    moments = [v for s in trainer.optimizer.state.values() for v in s.values() if v.dim() > 0]
    found["optimizer"] = sum(_local_bytes(m) for m in moments)
    copies = [getattr(producer.engine, "copy", None), trainer.reference]
    found["whole copies"] = sum(
        _local_bytes(t) for c in copies if c is not None for t in _unique(list(c.parameters()))
    )
    found["peak RSS"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    found["total parameters"] = sum(p.numel() for p in params)
    (out / f"{strategy}-rank{world.rank}.json").write_text(json.dumps(found))
    dist_setup.teardown(world)


def measured(hidden: int, layers: int) -> dict[str, dict[str, float]]:
    """Each strategy's rank-0 figures (both ranks hold the same amounts)."""
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for strategy in ("ddp", "fsdp"):
            cmd = [str(BIN / "torchrun"), "--standalone", "--nproc_per_node=2", __file__]
            cmd += ["--worker", tmp, strategy, "--hidden", str(hidden), "--layers", str(layers)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
            if proc.returncode:
                raise SystemExit(f"{strategy} failed:\n{proc.stderr[-3000:]}")
            results[strategy] = json.loads(Path(tmp, f"{strategy}-rank0.json").read_text())
    return results


def _print_measured(results: dict[str, dict[str, float]]) -> None:
    count = int(results["ddp"]["total parameters"])
    print(
        f"measured: 2 CPU ranks (gloo), {count / 1e6:.1f}M parameters, bfloat16 on float32 "
        "masters, one RL step"
    )
    print(f"{'per rank, MiB':<16}{'ddp':>10}{'fsdp':>10}{'fsdp/ddp':>10}")
    keys = ["parameters", "gradients", "optimizer", "whole copies"]
    for key in [*keys, "total", "peak RSS"]:
        if key == "total":
            a, b = (sum(results[s][k] for k in keys) for s in ("ddp", "fsdp"))
        else:
            a, b = results["ddp"][key], results["fsdp"][key]
        ratio = f"{b / a:.2f}" if a else "-"
        print(f"{key:<16}{a / MIB:>10.1f}{b / MIB:>10.1f}{ratio:>10}")


#: Released sizes for the computed table: (name, parameters).
SIZES = [("Qwen2.5-1.5B", 1.54e9), ("Llama-3.1-8B", 8.03e9), ("Qwen2.5-32B", 32.8e9)]


def _print_computed(ranks: int = 8) -> None:
    """Full fine-tuning in bfloat16 on float32 masters: 4 bytes a weight, its gradient,
    8 for AdamW; under fsdp each rank also keeps the sampler's whole copy (2 bytes a
    parameter: the half-type linear weights)."""
    from art_hydra.preflight.rank_memory import per_rank

    print(
        f"\ncomputed (not measured): full fine-tuning, bfloat16 on float32 masters, "
        f"{ranks} GPUs, no activations"
    )
    print(f"{'GiB per rank':<16}{'ddp':>10}{'fsdp':>10}{'fsdp, offload':>16}")
    for name, count in SIZES:
        n = int(count)
        ddp = per_rank(n, strategy="ddp", ranks=ranks)
        sharded = {
            offload: per_rank(
                n, strategy="fsdp", ranks=ranks, copies=1, copy_bytes=2 * n, offload=offload
            )
            for offload in (False, True)
        }
        row = [ddp.total, sharded[False].total, sharded[True].on_device]
        print(f"{name:<16}" + "".join(f"{v / 2.0**30:>10.1f}" for v in row[:2]), end="")
        print(f"{row[2] / 2.0**30:>16.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", nargs=2, metavar=("OUT", "STRATEGY"))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker[0]), args.worker[1], args.hidden, args.layers)
        return
    _print_measured(measured(args.hidden, args.layers))
    _print_computed()


if __name__ == "__main__":
    main()
