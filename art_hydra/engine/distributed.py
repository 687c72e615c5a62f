"""Data-parallel training over ranks started by torchrun, or by a submitit (SLURM) job.

``distributed.strategy=ddp`` keeps a whole model per rank (DDP averages gradients);
``fsdp`` shards weights, gradients and optimizer state (:mod:`art_hydra.engine.sharding`).
Everything below holds for both: the same samples, the same collectives per step.

Each rank is one process with one device: it samples its own whole groups (its own
slice of every global batch, with its own sampler stream), packs and trains them, and
DDP averages the gradients, so an optimizer step on N ranks equals the single-process
step on the same global batch (each rank's loss is normalised by the global token
count). Every rank takes part in the same collectives, in the same order, by
construction:

* per step, on the main thread while the trainer thread is idle: one all-reduce of the
  step's loss-token count (before the inputs are put), and one of the step's metrics and
  of the stop flag (after the result), so all ranks stop at the same step;
* per step, in the trainer thread: DDP's gradient all-reduce (once per optimizer step),
  or FSDP's gathers and reduce-scatters (per block, in every training forward and
  backward; the gradients reduced on the last micro-batch only);
* per step under FSDP, after the optimizer step: one gather of the trained weights into
  each rank's whole sampling copy;
* per checkpoint: a gather of the producers' states (under FSDP also of the weights and
  optimizer moments, whole, to rank 0), then a barrier that waits for rank 0 to write,
  bounded by ``timeouts.checkpoint_s``.

The run's loop reaches these through its rank coordinator (:mod:`art_hydra.engine.ranks`),
whose single-process form calls none of them. Control collectives run on a gloo group of
their own (``gloo`` carries Python objects and names the ranks a barrier misses). A
collective that fails or runs past ``distributed.timeout_s`` stops the run with an error
naming the ranks that did not answer, read from their status files in the run folder
(``.ranks/``).
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from art_hydra import safe_json
from art_hydra.config.launch_plan import torchrun_world_size
from art_hydra.config.run_files import RANKS
from art_hydra.errors import RunStopped
from art_hydra.runs.run_folder import pid_alive, write_atomic

if TYPE_CHECKING:
    from art_hydra.config.schema import DistributedConfig


class RankFailure(RunStopped):
    """A collective failed or timed out: another rank died, raised or hangs."""


@dataclass
class World:
    """This process's place among the ranks (a world of 1 when not distributed)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    #: The gloo group for control collectives (None in a world of 1).
    control: Any = field(default=None, repr=False)
    #: The run folder, once known (rank status files live there).
    run_dir: Path | None = None
    #: How training spans the ranks (distributed.strategy): "ddp" or "fsdp".
    strategy: str = "ddp"
    #: The sharding settings (distributed.fsdp) where the strategy is "fsdp".
    fsdp: Any = field(default=None, repr=False)

    @property
    def shards(self) -> bool:
        """Whether the weights are sharded over the ranks (fsdp on more than one rank)."""
        return self.enabled and self.strategy == "fsdp"

    @property
    def enabled(self) -> bool:
        return self.size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def from_environment() -> World:
    """The world torchrun described in the environment (RANK, WORLD_SIZE, LOCAL_RANK)."""
    size = torchrun_world_size() or 1
    rank = int(os.environ.get("RANK", "0") or 0)
    local = int(os.environ.get("LOCAL_RANK", str(rank)) or rank)
    return World(rank=rank, size=size, local_rank=local)


def adopt_submitit_tasks() -> bool:
    """Inside a submitit job of several tasks (the SLURM launcher preset, or
    ``submitit_local``), describe the tasks as torchrun would (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT), so each task joins the job's process group as
    one rank. Returns whether this process is such a task. The port is drawn from the
    job id, so every task of a job picks the same one and two jobs on a node rarely
    share it."""
    # torchrun inside the job has described the ranks itself.
    if not os.environ.get("SUBMITIT_EXECUTOR") or "TORCHELASTIC_RUN_ID" in os.environ:
        return False
    from submitit import JobEnvironment
    from submitit.helpers import TorchDistributedEnvironment

    if JobEnvironment().num_tasks <= 1:
        return False
    # Each rank picks its own GPU (LOCAL_RANK) among those SLURM gave the node. Values
    # the submitting shell exported (sbatch passes its environment) are replaced; a
    # MASTER_PORT set there is kept, as submitit reads it first.
    TorchDistributedEnvironment().export(set_cuda_visible_devices=False, overwrite=True)
    return True


def setup(dist_cfg: DistributedConfig, device: Any) -> World:
    """Join the process group (once per process) and return this rank's world."""
    import torch
    import torch.distributed as dist

    world = from_environment()
    world.strategy, world.fsdp = dist_cfg.strategy.value, dist_cfg.fsdp
    if not world.enabled:
        return world
    timeout = datetime.timedelta(seconds=dist_cfg.timeout_s)
    if not dist.is_initialized():
        backend = dist_cfg.backend.value
        if backend == "auto":
            backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "nccl" and world.shards and dist_cfg.fsdp.cpu_offload:
            # Offloaded shards and their gradients live in CPU memory: their gathers and
            # norms need a CPU backend beside NCCL (as torchtitan starts it).
            backend = "cpu:gloo,cuda:nccl"
        try:
            if device.type == "cuda":
                torch.cuda.set_device(world.local_rank)
            dist.init_process_group(backend=backend, timeout=timeout)
        except (ValueError, RuntimeError) as exc:  # no rendezvous, no backend for the device
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RankFailure(
                f"distributed.backend={backend}: rank {world.rank} of {world.size} could not "
                f"join the process group ({first}). Start the ranks with torchrun (it sets "
                "RANK, MASTER_ADDR and MASTER_PORT), and use distributed.backend=auto (gloo "
                "on the CPU, nccl on GPUs)."
            ) from exc
    world.control = dist.new_group(backend="gloo", timeout=timeout)
    return world


def seed_for(seed: int, rank: int) -> int:
    """The sampler seed of ``rank``: the run's seed on rank 0 (a single process samples
    exactly as before), a distinct 63-bit stream on every other rank."""
    if rank == 0:
        return seed
    import hashlib

    digest = hashlib.sha256(f"art_hydra:{seed}:{rank}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# ---- status files ----------------------------------------------------------------


def write_status(world: World, state: str) -> None:
    """Record this rank's pid, host and state (``running``, ``done``, ``failed: ...``)."""
    if not world.enabled or world.run_dir is None:
        return
    folder = world.run_dir / RANKS
    folder.mkdir(parents=True, exist_ok=True)
    record = {"rank": world.rank, "pid": os.getpid(), "host": socket.gethostname(), "state": state}
    # The temp file is created exclusively: a link planted under its name is not followed.
    tmp = f".rank{world.rank}.{os.getpid()}.tmp"
    write_atomic(folder / f"rank{world.rank}.json", json.dumps(record), tmp_name=tmp)


def describe_others(world: World) -> str:
    """What the other ranks' status files say: who failed, who died, who still runs."""
    if world.run_dir is None:
        return "the other ranks left no status"
    here = socket.gethostname()
    notes = []
    for rank in range(world.size):
        if rank == world.rank:
            continue
        path = world.run_dir / RANKS / f"rank{rank}.json"
        try:
            record = safe_json.read(path)  # bounded: a regular file, depth, size
            if not isinstance(record, dict):
                raise ValueError(f"{path} holds no JSON object")
        except (OSError, ValueError):
            notes.append(f"rank {rank} never reported")
            continue
        pid, host, state = record.get("pid", 0), record.get("host", "?"), record.get("state")
        if state == "running" and host == here and not pid_alive(int(pid)):
            notes.append(f"rank {rank} (pid {pid}) died without a word (killed?)")
        elif state == "running":
            notes.append(f"rank {rank} (pid {pid} on {host}) is still running, or hangs")
        else:
            notes.append(f"rank {rank} (pid {pid} on {host}) {state}")
    return "; ".join(notes)


def failure(world: World, what: str, exc: BaseException, timeout_s: float) -> RankFailure:
    """The error a rank raises when a collective fails: names the other ranks' states."""
    first = str(exc).splitlines()[0] if str(exc) else ""
    return RankFailure(
        f"rank {world.rank} stopped: {what} failed ({type(exc).__name__}: {first}); "
        f"collectives wait at most distributed.timeout_s={timeout_s:g}s. The other ranks: "
        f"{describe_others(world)}."
    )


# ---- control collectives (main thread, trainer idle) ------------------------------


def all_sum(world: World, values: list[float]) -> list[float]:
    """Element-wise sums over the ranks."""
    if not world.enabled:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, group=world.control)
    return tensor.tolist()


def all_max(world: World, values: list[float]) -> list[float]:
    """Element-wise maxima over the ranks."""
    if not world.enabled:
        return list(values)
    import torch
    import torch.distributed as dist

    tensor = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=world.control)
    return tensor.tolist()


def gather_objects(world: World, obj: Any) -> list[Any]:
    """Every rank's ``obj``, in rank order, on every rank."""
    if not world.enabled:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj, group=world.control)
    return out


def broadcast_object(world: World, obj: Any) -> Any:
    """Rank 0's ``obj`` on every rank."""
    if not world.enabled:
        return obj
    import torch.distributed as dist

    box = [obj]
    dist.broadcast_object_list(box, src=0, group=world.control)
    return box[0]


def barrier(world: World, timeout_s: float) -> None:
    """Wait for every rank, at most ``timeout_s``; gloo's monitored barrier names the
    ranks that did not arrive."""
    if not world.enabled:
        return
    import torch.distributed as dist

    dist.monitored_barrier(
        group=world.control, timeout=datetime.timedelta(seconds=timeout_s), wait_all_ranks=True
    )


def teardown(world: World) -> None:
    if world.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
