"""Sharded training's rules (``distributed.strategy=fsdp``), decided from the config alone.

FSDP2 (``fully_shard``) shards the model the backend loads over the ranks: a backend
that cannot shard it, or CPU offload where there is no accelerator to offload from,
fails inside torch once the process group has formed; these rules say so before
anything starts. What only the machine decides (the installed torch, whether a GPU is
visible to ``backend.device=auto``, the memory each rank needs) is the world
pre-flight's (:mod:`art_hydra.preflight.rank_memory`). Settings that sharding never
reads (one rank, or ``strategy=ddp``) are :mod:`art_hydra.config.inert`'s warnings.
The list of both is in docs/distributed.md ("Sharded training").

Plain Python on the compose path: no torch.
"""

from __future__ import annotations

from collections.abc import Iterator

from omegaconf import DictConfig

from art_hydra.config import fields
from art_hydra.config.backends import Backend, get_backend
from art_hydra.config.launch_plan import world_size
from art_hydra.config.problems import Kind, Problem, Severity, fix
from art_hydra.config.rollout_engines import get_rollout_engine
from art_hydra.config.schema import AlgorithmName, Device, DistStrategy
from art_hydra.config.validator_registry import validator

#: The built-in torch sampler: the one engine that samples from a sharded run's whole copy.
TORCH_ENGINE = "torch"
#: The override that keeps every rank's model whole (DDP), what a run that cannot shard does.
DDP = {"distributed.strategy": DistStrategy.ddp.value}


def shards(backend: Backend) -> bool:
    """Whether FSDP2 can shard what ``backend`` loads: a backend that trains on several
    ranks (``several_ranks``) and whose declaration does not say it cannot (``shards``)."""
    return backend.several_ranks and backend.shards


def sharded(cfg: DictConfig) -> bool:
    """Whether the run shards its model: ``distributed.strategy=fsdp`` on more than one
    rank (one rank has nothing to shard over, and trains as one process)."""
    return cfg.distributed.strategy == DistStrategy.fsdp and world_size(cfg) > 1


def _default_backend() -> Backend | None:
    return get_backend(fields.default("backend.name"))


@validator
def sharding_can_run(cfg: DictConfig) -> Iterator[Problem]:
    """What FSDP2 refuses once the ranks have formed: a backend that cannot be sharded,
    and CPU offload on the CPU (torch's offload policy needs an accelerator: "Cannot
    access accelerator device when none is available")."""
    if not sharded(cfg):
        return
    ranks = world_size(cfg)
    backend = get_backend(cfg.backend.name)
    if backend is not None and not shards(backend):
        default = _default_backend()
        instead = backend.override_to(default) if default is not None else {}
        yield Problem(
            "distributed.strategy",
            DistStrategy.fsdp.value,
            f"FSDP2 shards the model the backend loads, block by block, over the {ranks} "
            f"ranks; {backend.words} cannot be sharded (its declaration: "
            f"shards={backend.shards}): it trains its own model on one device.",
            fix(
                instead,
                "the same sharded run on the torch backend",
                alt=fix(DDP) if backend.several_ranks else None,
            ),
        )
    if cfg.distributed.fsdp.cpu_offload and cfg.backend.device == Device.cpu:
        yield Problem(
            "distributed.fsdp.cpu_offload",
            True,
            "offloads the shards from an accelerator to CPU memory, and backend.device=cpu "
            "trains on the CPU: there is nothing to offload from, and torch's offload policy "
            "stops the run ('Cannot access accelerator device when none is available').",
            fix(
                {"distributed.fsdp.cpu_offload": False},
                "the shards already live in CPU memory",
            ),
        )


@validator
def sharded_rollouts_run_on_a_whole_copy(cfg: DictConfig) -> Iterator[Problem]:
    """Under sharding the rollouts run on each rank's whole copy of the policy, which the
    built-in sampler keeps. Any other engine would sample from the sharded policy (whose
    forwards are collectives: ranks decoding different lengths wait on each other
    forever) or be handed shards to sync as if they were weights."""
    if not sharded(cfg) or cfg.algorithm.name != AlgorithmName.rl:
        return
    engine = get_rollout_engine(cfg.rollout.engine)
    if engine is None or engine.name == TORCH_ENGINE or not engine.several_ranks:
        return  # unknown: its own rule; one rank only: refused as several ranks
    how = (
        "samples from the policy itself, whose forwards are collectives once sharded: "
        "ranks decoding different lengths would wait on each other forever"
        if engine.in_process_policy
        else "holds weights of its own, synced from the policy after every step, and a "
        "sharded policy has only shards to sync from"
    )
    yield Problem(
        "rollout.engine",
        engine.name,
        f"{how}; distributed.strategy=fsdp shards the policy over the {world_size(cfg)} "
        "ranks, and only the built-in sampler keeps a whole copy to sample from.",
        fix(
            {"rollout.engine": TORCH_ENGINE},
            "the built-in sampler on each rank's whole copy",
            alt=fix(DDP, "a whole model on every rank"),
        ),
    )


@validator
def offload_keeps_gathered_weights(cfg: DictConfig) -> Iterator[Problem]:
    """CPU offload exists to free device memory; ``reshard_after_forward=false`` keeps
    each block's gathered weights on the device from its forward to its backward, so at
    the backward's start the device holds the whole model's weights as with no sharding.
    It works (a warning): the moments and the optimizer step stay in CPU memory."""
    settings = cfg.distributed.fsdp
    if not sharded(cfg) or not settings.cpu_offload or settings.reshard_after_forward:
        return
    if cfg.backend.device == Device.cpu:
        return  # refused above
    yield Problem(
        "distributed.fsdp.reshard_after_forward",
        False,
        "keeps every block's gathered weights on the device until its backward, so at the "
        "end of the forward the device holds the whole model's weights, as with no "
        "sharding, while distributed.fsdp.cpu_offload=true still copies every shard to and "
        "from CPU memory each step: the offload saves the device little of what it costs.",
        fix(
            {"distributed.fsdp.reshard_after_forward": True},
            "free each block's weights after its forward",
            alt=fix({"distributed.fsdp.cpu_offload": False}),
        ),
        Kind.rule,
        Severity.warning,
    )
