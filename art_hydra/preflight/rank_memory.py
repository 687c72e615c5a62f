"""What each rank needs before training starts: a torch that can shard, an accelerator to
offload to, and memory for its share of the training state.

The arithmetic is :func:`per_rank`, a small public function (the benchmarks print the
multi-GPU figures it computes): the bytes one rank holds for the policy's weights, their
gradients, AdamW's two moments and the whole frozen copies, under ``ddp`` (everything
whole on every rank) or ``fsdp`` (weights, gradients and moments sharded 1/N; the copies
whole). :func:`estimate` fills it in from the config and the model's size, read without
torch from the folder's safetensors headers (or the tiny model's shape), in the dtypes
the torch backend trains in (``torch_backend.load_dtype``): float32 masters, gradients
and moments for full fine-tuning (bfloat16 ones under ``model.master_weights=false``); a
LoRA base frozen in the half type, its adapters and ``modules_to_save`` in float32; each
copy (the KL reference under ``rl.beta>0`` with full fine-tuning; the sampler's under
``fsdp``, or ``rl.overlap_rollouts``) with its linear weights in the half type
(``frozen_copy``). Activations, the gathered blocks of a sharded step and the allocator's
slack are left out: the figure is a floor, so the check refuses only a run whose state
alone exceeds the device's total memory (it cannot work), never one that might fit.

Nothing here imports torch (its version is read from the installed distribution).
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig

from art_hydra import model_files
from art_hydra.config import eval_rules
from art_hydra.config.backends import get_backend
from art_hydra.config.distributed_rules import DDP, sharded
from art_hydra.config.launch_plan import world_size
from art_hydra.config.problems import Fix, Problem, fix
from art_hydra.config.rollout_rules import engine_of
from art_hydra.config.schema import (
    AlgorithmName,
    Device,
    DistStrategy,
    DType,
    FinetuneMethod,
    ModelSource,
)
from art_hydra.preflight.common import model_folder, world_problem
from art_hydra.preflight.devices import cuda_present
from art_hydra.preflight.rollout_engine import gpu_facts, machine_memory_gib

#: The first torch whose FSDP2 (``torch.distributed.fsdp.fully_shard``) is public; 2.4 and
#: 2.5 have it only as ``torch.distributed._composable.fsdp``, which the engine does not use.
FSDP_TORCH = (2, 6)
#: What installs a torch that shards, within the versions art_hydra supports (pyproject).
FSDP_INSTALL = "pip install 'torch>=2.6,<2.15'"
GIB = 2**30
#: The most ranks a fix proposes (beyond, the run wants a larger device or LoRA).
MOST_RANKS = 1024


@dataclass(frozen=True)
class RankMemory:
    """The bytes one rank holds for training, before any activation."""

    #: Its share of the policy's parameters (frozen and trained).
    params: int
    #: Its share of the trained parameters' gradients.
    grads: int
    #: Its share of AdamW's two moments (each the size of a trained parameter).
    optimizer: int
    #: The whole frozen copies it holds (KL reference, sampler), never sharded.
    copies: int
    #: The part of params, grads and optimizer kept in CPU memory (FSDP's CPU offload).
    offloaded: int
    #: All of the above.
    total: int

    @property
    def on_device(self) -> int:
        """What the training device itself holds: the total less what is offloaded."""
        return self.total - self.offloaded


def per_rank(
    parameters: int,
    trainable: int | None = None,
    weight_bytes: int = 4,
    master_bytes: int = 4,
    strategy: str | DistStrategy = "ddp",
    ranks: int = 1,
    *,
    copies: int = 0,
    copy_bytes: int = 0,
    offload: bool = False,
) -> RankMemory:
    """The memory of one rank of ``ranks``.

    ``parameters``: every parameter the policy holds (a LoRA model's adapters and saved
    modules included); ``trainable``: those of them that train, each stored in
    ``master_bytes`` with a gradient of the same size and AdamW's two moments; the rest
    are frozen, stored in ``weight_bytes``. ``strategy`` ``"ddp"`` keeps all of it whole
    on every rank; ``"fsdp"`` gives each rank ``ceil(n / ranks)`` of each count (and
    ``offload`` keeps that share in CPU memory). ``copies`` whole frozen copies of
    ``copy_bytes`` each are held by every rank under either strategy. The defaults are
    full fine-tuning (``trainable`` None: every parameter) in float32 under DDP on one rank."""
    trainable = parameters if trainable is None else trainable
    name = getattr(strategy, "value", strategy)
    if name not in (DistStrategy.ddp.value, DistStrategy.fsdp.value):
        raise ValueError(f"strategy {strategy!r}: ddp or fsdp")
    split = ranks if name == DistStrategy.fsdp.value and ranks > 1 else 1
    frozen = math.ceil((parameters - trainable) / split)
    trained = math.ceil(trainable / split)
    params = frozen * weight_bytes + trained * master_bytes
    grads = trained * master_bytes
    optimizer = 2 * trained * master_bytes
    whole = copies * copy_bytes
    offloaded = params + grads + optimizer if offload and split > 1 else 0
    total = params + grads + optimizer + whole
    return RankMemory(params, grads, optimizer, whole, offloaded, total)


# ---- the model's size, from its files --------------------------------------------------


@dataclass(frozen=True)
class PolicySize:
    """The model's parameter counts, read without loading it."""

    #: Every parameter of the model as loaded (a tied head counted once).
    parameters: int
    #: Those in linear layers' weights: what a frozen copy stores in the half type.
    linear: int
    #: LoRA's adapter parameters on ``model.lora.target_modules`` (r x (in + out) each).
    adapters: int
    #: The parameters of ``model.lora.modules_to_save`` (trained copies beside the originals).
    saved: int
    #: The checkpoint's dtype (what ``model.dtype=auto`` loads), or None where unknown.
    checkpoint_dtype: str | None = None


def _matches(module: str, names: Any) -> bool:
    """peft's rule for a name list: the module's full name, or its last dotted parts."""
    return any(module == n or module.endswith(f".{n}") for n in map(str, names))


def size_of(shapes: Mapping[str, tuple[int, ...]], tied: bool, lora: Any) -> PolicySize:
    """The counts of a model whose tensors have ``shapes`` (name -> shape); ``tied``: its
    head shares the embedding matrix (no tensor of its own); ``lora``: ``model.lora``."""
    total = linear = adapters = saved = 0
    embedding = 0
    for name, shape in shapes.items():
        numel = math.prod(shape)
        total += numel
        module = name.rpartition(".")[0]
        last = module.rpartition(".")[2]
        two_d = len(shape) == 2 and name.endswith(".weight")
        if two_d and model_files.is_embedding(last):
            embedding = max(embedding, numel)
        elif two_d:
            linear += numel
        if two_d and _matches(module, lora.target_modules):
            adapters += lora.r * (shape[0] + shape[1])
        if _matches(module, lora.modules_to_save):
            saved += numel
    heads = [n for n in shapes if n.rpartition(".")[0].rpartition(".")[2] in model_files.HEAD_NAMES]
    if tied and not heads and "lm_head" in map(str, lora.modules_to_save):
        saved += embedding  # the tied head is trained as a copy of the embedding matrix
    return PolicySize(total, linear, adapters, saved)


def tiny_shapes(model_cfg: Any) -> dict[str, tuple[int, ...]]:
    """The tiny model's tensors (engine/backends/tiny.py: a Llama with an untied head, its
    vocabulary the tokenizer's specials and at most every printable character)."""
    from art_hydra.engine.backends.tiny import CHARSET, SPECIALS

    tiny = model_cfg.tiny
    vocab, h, inner = len(SPECIALS) + len(CHARSET), tiny.hidden_size, tiny.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, h)}
    for n in range(tiny.num_layers):
        block = f"model.layers.{n}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[f"{block}.self_attn.{proj}.weight"] = (h, h)
        shapes[f"{block}.mlp.gate_proj.weight"] = (inner, h)
        shapes[f"{block}.mlp.up_proj.weight"] = (inner, h)
        shapes[f"{block}.mlp.down_proj.weight"] = (h, inner)
        shapes[f"{block}.input_layernorm.weight"] = (h,)
        shapes[f"{block}.post_attention_layernorm.weight"] = (h,)
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (vocab, h)
    return shapes


def policy_size(model_cfg: Any) -> PolicySize | None:
    """The size of the model ``model_cfg`` (the model section) names: the tiny model's
    from its shape, a folder's from its safetensors headers (None where they cannot be
    read: the model's own check reports the folder)."""
    if model_cfg.source == ModelSource.tiny:
        return size_of(tiny_shapes(model_cfg), False, model_cfg.lora)
    folder = model_folder(model_cfg)
    if folder is None:
        return None
    try:
        config = model_files.read_json_file(folder / "config.json")
        files, _ = model_files.weight_files(folder)
        tensors = model_files.folder_tensors(folder)
    except (model_files.FolderError, OSError):
        return None
    if not isinstance(config, dict):
        return None
    shapes = {name: tensor.shape for name, tensor in tensors.items()}
    size = size_of(shapes, model_files.tied_embeddings(config), model_cfg.lora)
    found = model_files.checkpoint_dtype(config, tensors, files[0] if files else None)
    return PolicySize(**{**size.__dict__, "checkpoint_dtype": found[0] if found else None})


# ---- the config's figures ---------------------------------------------------------------


def _half(model_cfg: Any, size: PolicySize) -> bool:
    """Whether the model computes in a half type (model.dtype's, or auto's checkpoint's)."""
    if model_cfg.dtype in (DType.bfloat16, DType.float16):
        return True
    return model_cfg.dtype == DType.auto and size.checkpoint_dtype in ("bfloat16", "float16")


def whole_copies(
    cfg: DictConfig, strategy: DistStrategy, ranks: int, finetune: FinetuneMethod | None = None
) -> int:
    """The whole frozen copies each rank holds: the KL reference (RL, rl.beta > 0, full
    fine-tuning: under LoRA it is the base with the adapters off), and the sampler's
    (sharded: RL's rollouts, or SFT's evaluation, sample from a whole copy; else only the
    overlapped sampler's copy, rl.overlap_rollouts)."""
    rl = cfg.algorithm.name == AlgorithmName.rl
    full = (finetune or cfg.model.finetune) == FinetuneMethod.full
    engine = engine_of(cfg)
    in_process = engine is None or engine.in_process_policy
    reference = rl and cfg.rl.beta > 0 and full
    if strategy == DistStrategy.fsdp and ranks > 1:
        sampler = (rl and in_process) or eval_rules.enabled(cfg)
    else:
        sampler = rl and in_process and bool(cfg.rl.overlap_rollouts)
    return int(reference) + int(sampler)


def estimate(
    cfg: DictConfig,
    size: PolicySize,
    strategy: DistStrategy,
    ranks: int,
    offload: bool = False,
    finetune: FinetuneMethod | None = None,
) -> RankMemory:
    """One rank's memory for ``cfg``'s model of ``size``, under ``strategy`` on ``ranks``
    (``offload``: FSDP's CPU offload; ``finetune``: instead of model.finetune)."""
    model = cfg.model
    half = _half(model, size)
    p = size.parameters
    finetune = finetune or model.finetune
    if finetune == FinetuneMethod.full:
        pure = half and not model.master_weights  # bfloat16 weights and moments
        master = 2 if pure else 4
        parameters, trainable, weight = p, p, master
        copy = 2 * p if pure else (2 * size.linear + 4 * (p - size.linear) if half else 4 * p)
    else:
        weight, master = (2 if half else 4), 4
        trainable = size.adapters + size.saved
        parameters = p + trainable
        copy = p * weight + trainable * (2 if half else 4)
    return per_rank(
        parameters,
        trainable,
        weight,
        master,
        strategy,
        ranks,
        copies=whole_copies(cfg, strategy, ranks, finetune),
        copy_bytes=copy,
        offload=offload,
    )


def size_text(n: float) -> str:
    """Bytes in the largest binary unit that keeps a whole number in front (3 digits)."""
    for unit, scale in (("GiB", GIB), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} bytes"


# ---- the checks -------------------------------------------------------------------------


def installed_torch() -> str | None:
    """The installed torch's version, from its distribution (torch is not imported)."""
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def _release(version: str) -> tuple[int, ...]:
    found = re.match(r"(\d+)\.(\d+)", version)
    return (int(found[1]), int(found[2])) if found else (0,)


def training_device(cfg: DictConfig) -> str:
    """The device the ranks train on: backend.device, or (auto) CUDA where it is visible."""
    if cfg.backend.device == Device.cpu:
        return "cpu"
    if cfg.backend.device == Device.cuda:
        return "cuda"
    return "cuda" if cuda_present() else "cpu"


def device_memory(device: str) -> int | None:
    """One device's total memory in bytes: the first GPU's (nvidia-smi), or the machine's
    (/proc/meminfo) for the CPU; None where it cannot be read."""
    if device == "cuda":
        facts = gpu_facts()
        return int(facts[0] * GIB) if facts else None
    memory = machine_memory_gib()
    return int(memory[0] * GIB) if memory else None


def host_memory() -> int | None:
    """The machine's total memory in bytes (what CPU offload puts the shards in)."""
    memory = machine_memory_gib()
    return int(memory[0] * GIB) if memory else None


def local_ranks(ranks: int) -> int:
    """The ranks that share this machine: torchrun's LOCAL_WORLD_SIZE, else (a planned or
    local launch) all of them."""
    value = os.environ.get("LOCAL_WORLD_SIZE", "")
    return min(int(value), ranks) if value.isdigit() and int(value) > 0 else ranks


def sharding_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    """A sharded run's torch and accelerator, and every multi-rank (or single) run's
    memory per rank against its device's."""
    found: list[Problem] = []
    if sharded(cfg):
        version = installed_torch()
        if version is not None and _release(version) < FSDP_TORCH:
            found.append(_old_torch(version))
        offload = cfg.distributed.fsdp.cpu_offload
        auto = cfg.backend.device == Device.auto
        if devices_here and offload and auto and not cuda_present():
            found.append(_nothing_to_offload())
    if devices_here:
        found += memory_problems(cfg)
    return found


def _old_torch(version: str) -> Problem:
    wanted = ".".join(map(str, FSDP_TORCH))
    return world_problem(
        "distributed.strategy",
        DistStrategy.fsdp.value,
        f"torch {version} is installed; sharding needs torch {wanted} or newer, where FSDP2's "
        "fully_shard is public (torch 2.4 and 2.5 have it only under "
        "torch.distributed._composable.fsdp, which art_hydra does not use).",
        fix(note=FSDP_INSTALL, alt=fix(DDP, "a whole model on every rank")),
    )


def _nothing_to_offload() -> Problem:
    return world_problem(
        "distributed.fsdp.cpu_offload",
        True,
        "offloads the shards from an accelerator to CPU memory, and no CUDA GPU is visible "
        "here: backend.device=auto trains on the CPU, where there is nothing to offload from, "
        "and torch's offload policy stops the run ('Cannot access accelerator device when "
        "none is available').",
        fix(
            {"distributed.fsdp.cpu_offload": False},
            "the shards already live in CPU memory",
            alt=fix(note="run on a machine whose GPUs are visible (CUDA_VISIBLE_DEVICES)"),
        ),
    )


def memory_problems(cfg: DictConfig) -> list[Problem]:
    """Each rank's training state (:func:`estimate`) against its device's total memory;
    a backend that stores weights its own way (Unsloth's precision, 4-bit) is left out."""
    backend = get_backend(cfg.backend.name)
    if backend is None or backend.own_precision or cfg.model.load_in_4bit:
        return []
    size = policy_size(cfg.model)
    if size is None or size.parameters == 0:
        return []
    ranks, device = world_size(cfg), training_device(cfg)
    total = device_memory(device)
    if total is None:
        return []
    strategy = cfg.distributed.strategy
    offload = sharded(cfg) and bool(cfg.distributed.fsdp.cpu_offload)
    memory = estimate(cfg, size, strategy, ranks, offload)
    short = _shortfall(memory, device, total, ranks)
    if short is None:
        return _loading_problems(cfg, size, device, total, ranks)
    key, value = (
        ("distributed.strategy", strategy.value)
        if ranks > 1
        else ("model.finetune", cfg.model.finetune.name)
    )
    return [
        world_problem(
            key, value, _reason(memory, size, ranks, short), _fixes(cfg, size, device, total, ranks)
        )
    ]


def loaded_whole(cfg: DictConfig, size: PolicySize, finetune: FinetuneMethod | None = None) -> int:
    """The bytes of the model as each rank loads it, whole, onto its device: a sharded run
    shards it only after the load, so this is the device's peak before training."""
    return estimate(cfg, size, DistStrategy.ddp, 1, finetune=finetune).params


def _loading_problems(
    cfg: DictConfig, size: PolicySize, device: str, total: int, ranks: int
) -> list[Problem]:
    """A sharded run whose state per rank fits, but whose model does not fit the device
    whole, as every rank loads it before sharding it."""
    if not sharded(cfg):
        return []
    local = local_ranks(ranks) if device == "cpu" else 1
    whole = loaded_whole(cfg, size)
    if whole * local <= total:
        return []
    where = (
        f"a GPU here has {size_text(total)} in all"
        if device == "cuda"
        else f"the {local} ranks on this machine share its {size_text(total)} of memory"
    )
    remedy = fix(note="a device with more memory, or a smaller model")
    if cfg.model.finetune == FinetuneMethod.full:
        lora = loaded_whole(cfg, size, FinetuneMethod.lora)
        state = estimate(cfg, size, cfg.distributed.strategy, ranks, finetune=FinetuneMethod.lora)
        if _lora_loads(cfg, size, device, total, ranks) and _fits(state, device, total, ranks):
            remedy = fix(
                {"model.finetune": FinetuneMethod.lora.name},
                f"its half-type base loads in about {size_text(lora)}",
                alt=remedy,
            )
    return [
        world_problem(
            "distributed.strategy",
            DistStrategy.fsdp.value,
            f"each rank loads the whole model ({size_text(whole)} of weights as they train) "
            f"onto its device before sharding it, and {where}: the sharded state would fit, "
            "the load does not.",
            remedy,
        )
    ]


def _lora_loads(cfg: DictConfig, size: PolicySize, device: str, total: int, ranks: int) -> bool:
    """Whether the model under LoRA loads whole on each device (what a sharded run does
    before sharding it; a run that does not shard holds it whole anyway)."""
    local = local_ranks(ranks) if device == "cpu" else 1
    return loaded_whole(cfg, size, FinetuneMethod.lora) * local <= total


def _shortfall(memory: RankMemory, device: str, total: int, ranks: int) -> str | None:
    """Where the state does not fit, in words (None: it fits): one GPU, the machine's
    memory the local ranks share, or (offload) the machine's memory the shards share."""
    local = local_ranks(ranks)
    if device == "cuda" and memory.on_device > total:
        return f"a GPU here has {size_text(total)} in all"
    if device == "cpu" and memory.total * local > total:
        if local > 1:
            return f"the {local} ranks on this machine share its {size_text(total)} of memory"
        return f"this machine has {size_text(total)} of memory in all"
    host = host_memory()
    if memory.offloaded and host is not None and memory.offloaded * local > host:
        return (
            f"CPU offload keeps {size_text(memory.offloaded)} of each rank's shards in CPU "
            f"memory, {local} ranks' worth on this machine, which has {size_text(host)} in all"
        )
    return None


def _fits(memory: RankMemory, device: str, total: int, ranks: int) -> bool:
    return _shortfall(memory, device, total, ranks) is None


def _reason(memory: RankMemory, size: PolicySize, ranks: int, short: str) -> str:
    who = f"each of the {ranks} ranks" if ranks > 1 else "the one process"
    parts = (
        f"weights {size_text(memory.params)}, gradients {size_text(memory.grads)}, AdamW moments "
        f"{size_text(memory.optimizer)}"
    )
    if memory.copies:
        parts += f", whole frozen copies (KL reference, sampler) {size_text(memory.copies)}"
    return (
        f"{who} holds about {size_text(memory.total)} of training state for the model's "
        f"{size.parameters:,} parameters before any activation ({parts}), and {short}: "
        "the run cannot fit."
    )


def _fixes(cfg: DictConfig, size: PolicySize, device: str, total: int, ranks: int) -> Fix:
    """What fits, best first: sharding over the same ranks, CPU offload (a GPU run),
    LoRA, more ranks (GPUs: each brings its own memory); else a larger device."""
    fsdp, found = DistStrategy.fsdp, []
    sharding = cfg.distributed.strategy == fsdp
    # Every rank loads the model whole before sharding it: no sharded fix helps a model
    # that does not load.
    local = local_ranks(ranks) if device == "cpu" else 1
    loads = loaded_whole(cfg, size) * local <= total
    if ranks > 1 and not sharding and loads:
        m = estimate(cfg, size, fsdp, ranks)
        if _fits(m, device, total, ranks):
            found.append(
                fix({"distributed.strategy": fsdp.value}, f"about {size_text(m.total)} per rank")
            )
    if ranks > 1 and device == "cuda" and not cfg.distributed.fsdp.cpu_offload and loads:
        m = estimate(cfg, size, fsdp, ranks, offload=True)
        if _fits(m, device, total, ranks):
            sets = {"distributed.strategy": fsdp.value, "distributed.fsdp.cpu_offload": True}
            found.append(
                fix(
                    sets if not sharding else {"distributed.fsdp.cpu_offload": True},
                    f"about {size_text(m.on_device)} per GPU, {size_text(m.offloaded)} per "
                    "rank in CPU memory",
                )
            )
    if cfg.model.finetune == FinetuneMethod.full:
        m = estimate(cfg, size, cfg.distributed.strategy, ranks, finetune=FinetuneMethod.lora)
        if _fits(m, device, total, ranks) and _lora_loads(cfg, size, device, total, ranks):
            found.append(
                fix(
                    {"model.finetune": FinetuneMethod.lora.name},
                    f"about {size_text(m.total)} per rank",
                )
            )
    more = _ranks_that_fit(cfg, size, device, total, ranks) if loads else None
    if more is not None:
        m = estimate(cfg, size, fsdp, more)
        found.append(
            fix(
                note=f"launch {more} ranks or more with distributed.strategy=fsdp "
                f"(about {size_text(m.total)} per rank)"
            )
        )
    if not found:
        found.append(fix(note="a device with more memory, or a smaller model"))
    chain = found[-1]
    for earlier in reversed(found[:-1]):
        chain = Fix(earlier.sets, earlier.note, chain)
    return chain


def _ranks_that_fit(
    cfg: DictConfig, size: PolicySize, device: str, total: int, ranks: int
) -> int | None:
    """The fewest ranks above ``ranks`` on which the sharded state fits one GPU each
    (None: none up to :data:`MOST_RANKS`, or a CPU run, whose ranks share one memory)."""
    if device != "cuda":
        return None
    for n in range(max(ranks, 1) + 1, MOST_RANKS + 1):
        if estimate(cfg, size, DistStrategy.fsdp, n).total <= total:
            return n
    return None
