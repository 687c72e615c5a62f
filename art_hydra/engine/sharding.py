"""``distributed.strategy=fsdp``: the weights, gradients and AdamW moments sharded over
the ranks with FSDP2 (``torch.distributed.fsdp.fully_shard``), as torchtune's
``shard_model`` and prime-rl's ``setup_fsdp`` do.

What is sharded, and what stays whole:

* each transformer block (the classes the model names in ``_no_split_modules``) is one
  FSDP unit, then the root: the :class:`~art_hydra.engine.rl.logprobs.PolicyLogprobs`
  around the model, so the embeddings, the final norm and the head (tied or not) are
  gathered once per training forward, however many chunks the head runs in. The
  optimizer is made after sharding, over the shards;
* mixed precision keeps its meaning: float32 masters, and the forward under the run's
  autocast (:meth:`LoadedModel.compute_precision`), so a sharded step computes the same
  numbers as a DDP step; the gathers move the masters' dtype;
* sampling runs on a **whole copy** of the policy on each rank (in the half type under
  mixed precision, as the overlapped sampler's copy is), refreshed by one collective
  gather after every optimizer step. A sharded forward gathers weights collectively, so
  ranks decoding completions of different lengths (or agents taking different numbers of
  turns) would wait on each other forever; the copy needs no collective to sample;
* checkpoints gather the full state dict on rank 0 (as torchtune and prime-rl do): the
  saved model is the same ``model.safetensors`` (or adapter) a single process writes,
  and the optimizer's moments are saved whole, so a checkpoint does not depend on the
  strategy that wrote it.

Every function here that gathers is a collective: all ranks call it at the same point,
and the run's loop guarantees that (they are called where the trainer thread is idle,
in the same order on every rank).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from art_hydra.config.schema import FSDPConfig


@dataclass
class Sharding:
    """The sharded policy's facts the run needs after :func:`shard`."""

    #: The device mesh of the ranks (one dimension: data parallel).
    mesh: Any
    #: The FSDP root (the PolicyLogprobs around the model) that trains.
    root: Any
    #: The model's structure on the meta device (no memory), from which whole copies
    #: are made (:func:`whole_copy`).
    skeleton: Any
    #: The FSDP units, block by block (for the memory figures and the tests).
    units: int

    def describe(self, ranks: int) -> str:
        return (
            f"sharding: FSDP2 over {ranks} ranks, {self.units} blocks and the root (embeddings, "
            f"head); each rank holds 1/{ranks} of the weights, gradients and AdamW moments"
        )


def is_sharded(tensor: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(tensor, DTensor)


def full(tensor: Any) -> torch.Tensor:
    """The whole tensor (a collective all-gather for a shard); a plain tensor as it is."""
    return tensor.full_tensor() if is_sharded(tensor) else tensor


def block_classes(model: Any) -> set[str]:
    """The class names of the model's transformer blocks: what Hugging Face declares
    never to split (``_no_split_modules``, the unit accelerate's FSDP wraps)."""
    names: set[str] = set()
    for module in model.modules():  # the transformers model, inside a LoRA tuner too
        names.update(getattr(module, "_no_split_modules", None) or ())
    return names


def blocks(model: Any) -> list[torch.nn.Module]:
    """The model's transformer blocks, outermost first (a block inside a block is part of
    it). Without ``_no_split_modules``, the entries of its longest ``ModuleList``."""
    names = block_classes(model)
    found: list[torch.nn.Module] = []
    inside: set[int] = set()
    for module in model.modules():
        if id(module) in inside:
            continue
        if type(module).__name__ in names:
            found.append(module)
            inside.update(id(m) for m in module.modules())
    if found:
        return found
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def mesh_type(device: Any) -> str:
    """The mesh's device type: the training device's. A gloo group on a machine with
    GPUs gets a CUDA mesh unless it is told (pytorch #132471), so it is always named."""
    return "cuda" if getattr(device, "type", "cpu") == "cuda" else "cpu"


def shard(
    policy: torch.nn.Module, model: Any, world: Any, fsdp: FSDPConfig, device: Any
) -> Sharding:
    """Shard ``policy`` (the PolicyLogprobs around ``model``) over ``world``'s ranks in
    place: every block, then the root. Returns the :class:`Sharding`."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

    skeleton = _meta_copy(model)
    mesh = init_device_mesh(mesh_type(device), (world.size,))
    offload = CPUOffloadPolicy() if fsdp.cpu_offload else OffloadPolicy()
    units = blocks(model)
    for block in units:
        fully_shard(
            block,
            mesh=mesh,
            reshard_after_forward=fsdp.reshard_after_forward,
            offload_policy=offload,
        )
    # The root is gathered for the whole forward (the head runs in several chunks), and
    # its parameters are the first the backward needs: kept gathered after the forward.
    fully_shard(policy, mesh=mesh, reshard_after_forward=False, offload_policy=offload)
    return Sharding(mesh=mesh, root=policy, skeleton=skeleton, units=len(units))


def _meta_copy(model: Any) -> Any:
    """``model``'s structure with every tensor on the meta device (no memory, no copy)."""
    import copy

    memo: dict[int, Any] = {}
    for param in model.parameters():
        memo[id(param)] = torch.nn.Parameter(
            torch.empty_like(param, device="meta"), requires_grad=param.requires_grad
        )
    for buffer in model.buffers():
        memo[id(buffer)] = torch.empty_like(buffer, device="meta")
    return copy.deepcopy(model, memo)


@torch.no_grad()
def whole_copy(sharding: Sharding, model: Any, device: Any, prepare: Any = None) -> Any:
    """A plain, unsharded copy of ``model`` on every rank (a collective: each parameter
    gathered in turn), with its buffers, frozen and in evaluation mode: what sampling,
    evaluation and the KL reference run on, on ``device`` (the training device, also
    where CPU offload keeps the shards elsewhere). ``prepare(twin)`` may re-type the copy's
    parameters while they are still on the meta device (the half-type linear weights of
    :func:`~art_hydra.engine.backends.torch_backend.frozen_copy`): each gathered tensor
    is then stored in that type, one at a time, so no second whole copy is ever held."""
    import copy

    twin = copy.deepcopy(sharding.skeleton)
    if prepare is not None:
        prepare(twin)
    _materialize(twin, device)
    params = dict(model.named_parameters())
    for name, param in twin.named_parameters():
        param.copy_(full(params[name]))
    buffers = dict(model.named_buffers())
    for name, buffer in twin.named_buffers():
        buffer.copy_(full(buffers[name]))
    return twin.eval().requires_grad_(False)


def _materialize(twin: Any, device: Any) -> None:
    """Give the meta-device ``twin`` empty tensors on ``device``, one per distinct meta
    tensor: a parameter two modules share (a head tied to the embeddings) stays one
    parameter, as ``Module.to_empty`` would not keep it."""
    made: dict[int, Any] = {}
    for module in twin.modules():
        for name, param in list(module._parameters.items()):
            if param is not None:
                if id(param) not in made:
                    empty = torch.empty_like(param, device=device)
                    made[id(param)] = torch.nn.Parameter(empty, requires_grad=param.requires_grad)
                module._parameters[name] = made[id(param)]
        for name, buffer in list(module._buffers.items()):
            if buffer is not None:
                if id(buffer) not in made:
                    made[id(buffer)] = torch.empty_like(buffer, device=device)
                module._buffers[name] = made[id(buffer)]


@torch.no_grad()
def gathered_state(model: Any, main: bool, trained_only: bool = False) -> dict[str, torch.Tensor]:
    """``model``'s whole state dict (a collective), kept on the CPU of the ``main`` rank
    only: the others gather and drop each tensor, so no rank holds two whole copies.
    Tied tensors (a head sharing the embeddings) stay one tensor under both names, as in
    the unsharded model's state dict, so ``save_pretrained`` writes the tie as it does
    for a single process. ``trained_only``: the parameters that train (adapters)."""
    out: dict[str, torch.Tensor] = {}
    seen: dict[int, torch.Tensor] = {}
    if trained_only:
        values = {n: p for n, p in model.named_parameters() if p.requires_grad}
    else:
        values = model.state_dict(keep_vars=True)
    for name, value in values.items():
        if id(value) in seen:
            if main:
                out[name] = seen[id(value)]
            continue
        whole = full(value.detach())
        if main:
            out[name] = seen[id(value)] = whole.cpu().clone()
        else:
            seen[id(value)] = whole[:0]
    return out


def read_placed(path: Any, target: Any) -> dict[str, Any]:
    """The tensors of the safetensors file ``path``, each read alone and, where
    ``target(name, shape)`` names a sharded tensor, cut at once to this rank's shard of
    it: a rank never holds more than one whole tensor of the file (on resume every rank
    reads the same checkpoint, so whole files would cost each rank the whole model and
    moments in CPU memory). Tensors without a sharded target stay whole."""
    from safetensors import safe_open

    found: dict[str, Any] = {}
    with safe_open(str(path), framework="pt", device="cpu") as handle:
        for name in handle.keys():  # noqa: SIM118 (safe_open is no mapping)
            like = target(name, tuple(handle.get_slice(name).get_shape()))
            value = handle.get_tensor(name)
            found[name] = place_like(value, like) if like is not None else value
    return found


def parameter_target(model: Any) -> Any:
    """``read_placed``'s target for ``model``'s own state names (a tied head's too)."""
    own = {
        **dict(model.named_parameters(remove_duplicate=False)),
        **dict(model.named_buffers(remove_duplicate=False)),
    }

    def target(name: str, shape: tuple[int, ...]) -> Any:
        like = own.get(name)
        return like if like is not None and tuple(like.shape) == shape else None

    return target


def place_on_load(model: Any) -> None:
    """Let ``model.load_state_dict`` take whole tensors (every rank read the same
    checkpoint file): each is cut to this rank's shard of the parameter it loads into,
    so the loaders of a single process (``load_state_dict``, peft's
    ``set_peft_model_state_dict``) work unchanged on a sharded model. (peft with
    transformers 5 cuts DTensor targets itself; the hook then sees shards and passes
    them on.)"""
    own = {
        **dict(model.named_parameters(remove_duplicate=False)),  # a tied head's name too
        **dict(model.named_buffers(remove_duplicate=False)),
    }

    def hook(module: Any, state_dict: dict[str, Any], prefix: str, *_: Any) -> None:
        for key, value in list(state_dict.items()):  # shards (read_placed) pass as they are
            like = own.get(key[len(prefix) :]) if key.startswith(prefix) else None
            if like is not None and torch.is_tensor(value) and not is_sharded(value):
                state_dict[key] = place_like(value, like)

    model.register_load_state_dict_pre_hook(hook)


def place_like(value: torch.Tensor, like: Any) -> Any:
    """``value`` (a whole tensor every rank read from the same file) as ``like`` is laid
    out: this rank's shard of it where ``like`` is sharded (no communication from torch
    2.7; the whole tensor passes through the mesh's device, one tensor at a time)."""
    if not is_sharded(like):
        return value
    from torch.distributed.tensor import distribute_tensor

    local = value.to(like.to_local().device, like.dtype)
    if _keeps_local_data():
        return distribute_tensor(local, like.device_mesh, like.placements, src_data_rank=None)
    # torch 2.6 scatters rank 0's tensor (every rank calls this in the same order, and
    # every rank read the same file, so the shards are the same).
    return distribute_tensor(local, like.device_mesh, like.placements)


def _keeps_local_data() -> bool:
    """Whether ``distribute_tensor`` can cut each rank's own copy without communication
    (``src_data_rank=None``, from torch 2.7)."""
    import inspect

    from torch.distributed.tensor import distribute_tensor

    return "src_data_rank" in inspect.signature(distribute_tensor).parameters
