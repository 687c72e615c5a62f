"""A Hugging Face model folder read as files, without torch or transformers.

The world pre-flight decides from these files alone whether ``from_pretrained`` would
load the model and whether the run fits it: ``config.json`` (its ``model_type`` known to
the installed transformers, its position limit, its sizes), the safetensors headers
(8-byte little-endian length, then JSON) and the shard index, and where a hub id lies in
the local cache. Importing transformers would pull torch in (seconds, and the pre-flight
must stay light), so the known model types are read from its source with :mod:`ast`.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import math
import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from art_hydra import safe_json
from art_hydra.safe_paths import open_regular, path_refusal

#: The largest config.json / index / tokenizer_config read (real ones are kilobytes).
CONFIG_MAX_BYTES = 4 << 20
#: The largest safetensors header read (real ones are well under a megabyte).
HEADER_MAX_BYTES = 100 << 20
#: Keys that hold the number of positions a model has, by family (gpt2: n_positions).
POSITION_KEYS = ("max_position_embeddings", "n_positions", "n_ctx", "seq_length")
#: Keys that hold the width of the embeddings, by family.
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
#: Bytes per element of each safetensors dtype.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "F8_E8M0": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
    "C64": 8,
}
#: Whether a config that does not say ties the head to the embeddings (transformers'
#: ``PreTrainedConfig`` default).
_TIED_BY_DEFAULT = True
#: Suffixes of the input embedding matrix's name, by family.
EMBEDDING_SUFFIXES = ("embed_tokens.weight", "wte.weight", "word_embeddings.weight")
#: A hub repository id, of a model or a dataset: ``name`` or ``owner/name``.
HUB_ID = re.compile(r"^[A-Za-z0-9_][\w.-]*(/[\w.-]+)?$")


class FolderError(ValueError):
    """Why a model folder cannot be loaded; the message names the file."""


# ---- the installed transformers, read as source ---------------------------------------


@functools.cache
def known_model_types() -> frozenset[str] | None:
    """Every ``model_type`` the installed transformers maps to a config class (its
    ``CONFIG_MAPPING_NAMES``), read from the source with :mod:`ast`; None when
    transformers is not installed or its source has moved (the check is then skipped)."""
    return _auto_mapping("CONFIG_MAPPING_NAMES", ("auto_mappings.py", "configuration_auto.py"))


@functools.cache
def causal_lm_model_types() -> frozenset[str] | None:
    """The ``model_type`` values ``AutoModelForCausalLM`` can build (its
    ``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``): a known type outside it (t5, vit, whisper)
    has no causal-LM class, and the load would fail."""
    return _auto_mapping(
        "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", ("auto_mappings.py", "modeling_auto.py")
    )


def _auto_mapping(mapping: str, sources: tuple[str, ...]) -> frozenset[str] | None:
    """The keys of one of transformers' auto mappings, read from its source files."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    auto = Path(next(iter(spec.submodule_search_locations))) / "models" / "auto"
    start = re.compile(rf"^{mapping}(\s*=|\.update\()", re.MULTILINE)
    names: set[str] = set()
    for source in sources:
        try:
            text = (auto / source).read_text(encoding="utf-8")
            for chunk in _mapping_statements(text, start):
                names |= _mapping_keys(ast.parse(chunk), mapping)
        except (OSError, SyntaxError, ValueError):
            continue
    return frozenset(names) or None


#: The next top-level line that is not a closing bracket: where that statement ended.
_NEXT_STATEMENT = re.compile(r"^[^\s)\]}#]", re.MULTILINE)


def _mapping_statements(text: str, start_at: re.Pattern[str]) -> list[str]:
    """The source of each top-level statement that touches CONFIG_MAPPING_NAMES (parsing
    only these is ten times faster than the whole module, which holds other mappings)."""
    chunks = []
    for start in start_at.finditer(text):
        end = _NEXT_STATEMENT.search(text, start.end())
        chunks.append(text[start.start() : end.start() if end else len(text)])
    return chunks


def _mapping_keys(tree: ast.Module, mapping: str) -> set[str]:
    """The string keys given to ``CONFIG_MAPPING_NAMES`` in a module: assigned as an
    ``OrderedDict([(key, cls), ...])`` or a dict, or added with ``.update({...})``."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        value = None
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == mapping for t in node.targets
        ):
            value = node.value
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "update"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == mapping
        ):
            value = node
        if value is None:
            continue
        for inner in ast.walk(value):
            if isinstance(inner, ast.Tuple) and len(inner.elts) == 2:
                first = inner.elts[0]
                if isinstance(first, ast.Constant) and isinstance(first.value, str):
                    keys.add(first.value)
            elif isinstance(inner, ast.Dict):
                keys.update(
                    k.value
                    for k in inner.keys
                    if isinstance(k, ast.Constant) and isinstance(k.value, str)
                )
    return keys


# ---- config.json -----------------------------------------------------------------------


def read_json_file(path: Path) -> Any:
    """A small JSON file of the folder, bounded; :class:`FolderError` naming it if not."""
    try:
        return safe_json.read(path, max_bytes=CONFIG_MAX_BYTES)
    except ValueError as exc:
        raise FolderError(str(exc)) from exc


def text_config(config: dict[str, Any]) -> dict[str, Any]:
    """The part of a config that describes the language model (a multimodal config keeps
    it under ``text_config``)."""
    inner = config.get("text_config")
    return inner if isinstance(inner, dict) else config


def config_value(config: dict[str, Any], keys: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of ``keys`` the (text) config holds as a positive integer, with its name."""
    for part in (text_config(config), config):
        for key in keys:
            value = part.get(key)
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                return key, value
    return None


def position_limit(config: dict[str, Any]) -> tuple[str, int] | None:
    """The number of positions the model has (a sliding window is no limit: positions
    beyond it still have embeddings), and the key that says so."""
    return config_value(config, POSITION_KEYS)


def folder_positions(folder: Path | None) -> int | None:
    """The position limit of the model in ``folder`` (its config.json); None without a
    folder, or where the config cannot be read or names no limit (the folder's own
    check says why)."""
    if folder is None:
        return None
    try:
        config = read_json_file(folder / "config.json")
    except FolderError:
        return None
    found = position_limit(config) if isinstance(config, dict) else None
    return found[1] if found else None


def looks_local(name: str) -> bool:
    """Whether ``model.name`` names a path rather than a hub id."""
    return (
        name.startswith(("/", "./", "../", "~"))
        or os.path.exists(os.path.expanduser(name))
        or not HUB_ID.match(name)
    )


def load_folder(name: str, revision: str | None) -> Path | None:
    """The folder ``model.name`` loads from, without loading it: a local folder, or a hub
    id's cached snapshot; None when neither is here (a hub id downloads at load), or for
    a path the run may not read. The pre-flight and the run decide it here, alike."""
    if path_refusal(os.path.expanduser(name)) is not None:
        return None
    if looks_local(name):
        folder = Path(os.path.expanduser(name))
        return folder if folder.is_dir() else None
    try:
        return cached_snapshot(name, revision)
    except OSError:
        return None


def model_positions(name: str, revision: str | None) -> int | None:
    """The positions of ``model.name`` without loading it: its :func:`load_folder`'s
    config.json (None: no folder is here yet)."""
    return folder_positions(load_folder(name, revision))


def vocab_size(config: dict[str, Any]) -> int | None:
    found = config_value(config, ("vocab_size",))
    return found[1] if found else None


def hidden_size(config: dict[str, Any]) -> tuple[str, int] | None:
    return config_value(config, HIDDEN_KEYS)


def tied_embeddings(config: dict[str, Any]) -> bool:
    """Whether the head shares the embedding matrix (transformers' default: tied)."""
    for part in (config, text_config(config)):
        if isinstance(part.get("tie_word_embeddings"), bool):
            return part["tie_word_embeddings"]
    return _TIED_BY_DEFAULT


# ---- safetensors ---------------------------------------------------------------------


@dataclass(frozen=True)
class Tensor:
    """One tensor of a safetensors file, as its header describes it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    file: str


def read_header(path: Path) -> dict[str, Tensor]:
    """The tensors of one safetensors file, from its header; :class:`FolderError` when the
    header cannot be read or the data it describes does not fill the file exactly (a
    truncated download)."""
    try:
        with open_regular(path) as handle:
            size = os.fstat(handle.fileno()).st_size
            head = handle.read(8)
            if len(head) < 8:
                raise FolderError(f"{path.name} is {size} bytes long: too short for a header")
            (length,) = struct.unpack("<Q", head)
            if length > min(HEADER_MAX_BYTES, size - 8):
                raise FolderError(
                    f"{path.name} declares a {length:,}-byte header in a {size:,}-byte file "
                    "(truncated or not a safetensors file)"
                )
            raw = handle.read(length)
    except OSError as exc:
        raise FolderError(f"{path.name} cannot be read: {exc.strerror or exc}") from exc
    try:  # bounded: a header nested 100,000 deep would raise RecursionError in json
        header = safe_json.loads(raw.decode("utf-8"))
    except safe_json.JsonRefused as exc:
        raise FolderError(
            f"{path.name} has a header that cannot be read within bounds: {exc} "
            f"(a safetensors header is a flat JSON object of at most {HEADER_MAX_BYTES:,} bytes)"
        ) from exc
    except ValueError as exc:
        raise FolderError(f"{path.name} has a header that is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise FolderError(f"{path.name} has a header that is not a JSON object")
    tensors: dict[str, Tensor] = {}
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, stop) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            expected = math.prod(shape) * DTYPE_BYTES[dtype]
            if not all(type(v) is int and v >= 0 for v in (*shape, begin, stop)):
                raise ValueError("shape and data_offsets must be whole numbers")
        except (KeyError, TypeError, ValueError) as exc:
            raise FolderError(f"{path.name}: tensor {name} has a malformed entry") from exc
        if stop - begin != expected:
            raise FolderError(
                f"{path.name}: tensor {name} ({dtype}, shape {list(shape)}) needs "
                f"{expected:,} bytes, the header gives it {stop - begin:,}"
            )
        end = max(end, stop)
        tensors[name] = Tensor(name, dtype, shape, path.name)
    data = size - 8 - length
    if end != data:
        what = "truncated" if end > data else "longer than its header says"
        raise FolderError(
            f"{path.name} is {what}: its header describes {end:,} bytes of tensor data, the "
            f"file holds {data:,} (an interrupted download or copy)"
        )
    return tensors


def weight_files(folder: Path) -> tuple[list[str], list[str]]:
    """(the safetensors files the model needs, those of them missing): the shards the
    ``model.safetensors.index.json`` lists, else every ``*.safetensors`` in the folder."""
    index = folder / "model.safetensors.index.json"
    if index.exists():
        data = read_json_file(index)
        weight_map = data.get("weight_map") if isinstance(data, dict) else None
        if not isinstance(weight_map, dict) or not all(
            isinstance(v, str) for v in weight_map.values()
        ):
            raise FolderError(f"{index.name} has no weight_map of tensor names to files")
        shards = sorted(set(weight_map.values()))
        bad = [s for s in shards if "/" in s or s.startswith(".")]
        if bad:
            raise FolderError(f"{index.name} names shards outside the folder: {bad[:3]}")
        return shards, [s for s in shards if not (folder / s).exists()]
    return sorted(p.name for p in folder.glob("*.safetensors")), []


def embedding_tensor(tensors: dict[str, Tensor]) -> Tensor | None:
    """The input embedding matrix (rows: the vocabulary, columns: the hidden size)."""
    for name in sorted(tensors, key=len):
        if name.endswith(EMBEDDING_SUFFIXES) and len(tensors[name].shape) == 2:
            return tensors[name]
    return None


def shape_mismatches(config: dict[str, Any], tensors: dict[str, Tensor]) -> list[str]:
    """The tensors whose shape disagrees with the config (the embedding and head against
    ``vocab_size`` and the hidden size; the attention and MLP projections of the common
    decoder layout against the head counts and ``intermediate_size``), and a layer count
    that differs from the config's: each named with its shape and the config's value."""
    vocab, hidden = vocab_size(config), hidden_size(config)
    found = []
    checked = [embedding_tensor(tensors), tensors.get("lm_head.weight")]
    for tensor in [t for t in checked if t is not None]:
        rows, cols = tensor.shape if len(tensor.shape) == 2 else (None, None)
        if vocab is not None and rows != vocab:
            found.append(_mismatch(tensor, f"vocab_size={vocab} (rows)"))
        elif hidden is not None and cols != hidden[1]:
            found.append(_mismatch(tensor, f"{hidden[0]}={hidden[1]} (columns)"))
    if found or hidden is None or isinstance(config.get("text_config"), dict):
        return found  # a multimodal model's other towers share the names: not judged
    found += _projection_mismatches(config, tensors, hidden[1])
    return found + _layer_mismatches(config, tensors)


def _mismatch(tensor: Tensor, says: str) -> str:
    return (
        f"{tensor.name} has shape {list(tensor.shape)} in {tensor.file}, but config.json says "
        f"{says}"
    )


def _projection_mismatches(
    config: dict[str, Any], tensors: dict[str, Tensor], hidden: int
) -> list[str]:
    """The first decoder layer's projections (``q_proj`` ... ``down_proj``, the layout of
    Llama, Qwen, Mistral, Gemma and most decoders) against the config."""
    text = text_config(config)
    heads = config_value(config, ("num_attention_heads",))
    kv = config_value(config, ("num_key_value_heads",)) or heads
    head_dim = text.get("head_dim")
    if not (isinstance(head_dim, int) and head_dim > 0) and heads:
        head_dim = hidden // heads[1]
    inner = config_value(config, ("intermediate_size",))
    expected: dict[str, tuple[int, ...] | None] = {
        "self_attn.q_proj.weight": (heads[1] * head_dim, hidden) if heads else None,
        "self_attn.k_proj.weight": (kv[1] * head_dim, hidden) if kv else None,
        "mlp.gate_proj.weight": (inner[1], hidden) if inner else None,
        "mlp.down_proj.weight": (hidden, inner[1]) if inner else None,
    }
    says = {
        "self_attn.q_proj.weight": "num_attention_heads x head_dim, hidden size",
        "self_attn.k_proj.weight": "num_key_value_heads x head_dim, hidden size",
        "mlp.gate_proj.weight": "intermediate_size, hidden size",
        "mlp.down_proj.weight": "hidden size, intermediate_size",
    }
    found = []
    for suffix, shape in expected.items():
        tensor = next((t for n, t in sorted(tensors.items()) if n.endswith(f".0.{suffix}")), None)
        if tensor is None or shape is None or tensor.shape == shape:
            continue
        found.append(_mismatch(tensor, f"{list(shape)} ({says[suffix]})"))
        break  # one is enough to know the config is not these weights'
    return found


#: A decoder layer's tensor, in the layouts of the common causal LMs.
_LAYER = re.compile(
    r"^(?:model\.layers|transformer\.h|gpt_neox\.layers|model\.decoder\.layers)\.(\d+)\."
)


def _layer_mismatches(config: dict[str, Any], tensors: dict[str, Tensor]) -> list[str]:
    """Fewer layers in the weights than the config has would load the rest randomly
    initialised (transformers only warns); more would be dropped."""
    layers = config_value(config, ("num_hidden_layers", "n_layer"))
    indices = {int(m.group(1)) for name in tensors if (m := _LAYER.search(name))}
    if layers is None or not indices or max(indices) + 1 == layers[1]:
        return []
    return [
        f"the weights hold {max(indices) + 1} layers, but config.json says "
        f"{layers[0]}={layers[1]} (missing layers would be initialised at random)"
    ]


# ---- the hub cache -------------------------------------------------------------------


def hub_cache() -> Path:
    """The folder Hugging Face keeps downloaded repositories in, read from the
    environment each time (huggingface_hub reads it once, at import)."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return Path(os.path.expanduser(os.environ[var]))
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "huggingface",
    )
    return Path(os.path.expanduser(home)) / "hub"


def cached_snapshot(repo_id: str, revision: str | None = None) -> Path | None:
    """The cached snapshot folder of a hub model at ``revision`` (a branch, tag or
    commit; default ``main``), found without any network call; None when not cached
    (or cached without its config.json)."""
    repo = hub_cache() / f"models--{repo_id.replace('/', '--')}"
    snapshots = repo / "snapshots"
    wanted = revision or "main"
    ref = repo / "refs" / wanted
    commit = wanted
    if ref.is_file():
        try:  # a commit hash: read no further than a hash could be (a FIFO is refused)
            with open_regular(ref) as handle:
                commit = handle.read(256).decode("utf-8").strip() or wanted
        except (OSError, ValueError):
            commit = wanted
        if not re.fullmatch(r"[\w-]+", commit):  # a hash; never a path out of snapshots/
            commit = wanted
    candidate = snapshots / commit
    if (candidate / "config.json").is_file():
        return candidate
    if revision is None and snapshots.is_dir():
        found = [s for s in snapshots.iterdir() if (s / "config.json").is_file()]
        if found:  # no refs/main (a copied cache): the newest snapshot
            return max(found, key=lambda s: s.stat().st_mtime)
    return None


# ---- what loading would decide, read from the files --------------------------------


def folder_tensors(folder: Path) -> dict[str, Tensor]:
    """Every tensor of the folder's weights (all shards), from their headers; raises
    :class:`FolderError` as :func:`read_header` and :func:`weight_files` do, and for a
    missing shard."""
    files, missing = weight_files(folder)
    if missing:
        raise FolderError(f"missing shards: {missing[:3]}")
    tensors: dict[str, Tensor] = {}
    for shard in files:
        tensors.update(read_header(folder / shard))
    return tensors


#: The safetensors dtypes ``dtype="auto"`` may load a model in, as the config spells them.
_FLOATS = {"F16": "float16", "BF16": "bfloat16", "F32": "float32", "F64": "float64"}


def checkpoint_dtype(
    config: dict[str, Any], tensors: dict[str, Tensor], first_file: str | None
) -> tuple[str, str] | None:
    """The dtype ``from_pretrained(dtype="auto")`` loads the model in, and where it reads
    it: config.json's ``dtype`` (``torch_dtype`` before transformers 5), else the first
    floating-point tensor of the first weight file (``first_file``); None when neither
    says."""
    for key in ("dtype", "torch_dtype"):
        value = config.get(key)
        if isinstance(value, str) and value:
            return value.removeprefix("torch."), f"config.json {key}={value}"
    if first_file is None:
        return None
    for tensor in sorted(tensors.values(), key=lambda t: t.name):
        if tensor.file == first_file and tensor.dtype in _FLOATS:
            return _FLOATS[tensor.dtype], f"its weights are {tensor.dtype} ({first_file})"
    return None


#: A ``model_type`` (or class) key of transformers' checkpoint conversion mappings.
_CONVERSION_KEY = re.compile(r'^\s+(?:mapping\[)?"([\w.-]+)"\]?\s*[:=]', re.MULTILINE)


@functools.cache
def renamed_at_load() -> frozenset[str] | None:
    """The model types (and class names) whose checkpoint names the installed
    transformers renames or fuses as it loads (``conversion_mapping.py``: Mixtral's
    experts become one fused parameter, a multimodal prefix moves): their safetensors
    names are not their modules' names. None when the source cannot be read."""
    spec = importlib.util.find_spec("transformers")
    if spec is None or not spec.submodule_search_locations:
        return None
    source = Path(next(iter(spec.submodule_search_locations))) / "conversion_mapping.py"
    try:
        text = source.read_text(encoding="utf-8")
    except OSError:
        return None
    names: set[str] = set()
    for line in text.splitlines():
        found = _CONVERSION_KEY.match(line)
        if found:
            names.add(found.group(1))
            # "minimax": "mixtral" (a family that borrows another's mapping): both.
            value = line.partition(":")[2].strip().rstrip(",").strip('"')
            if re.fullmatch(r"[\w.-]+", value):
                names.add(value)
    return frozenset(names) or None


def module_names(
    config: dict[str, Any], tensors: dict[str, Tensor]
) -> tuple[dict[str, str], list[str]]:
    """The modules the weights describe, as LoRA's name rules read them: each module
    name -> "" where peft can wrap it (a layer holding a ``weight`` of two or more
    dimensions: Linear, Conv1D, Embedding, Conv), else "a block" (it holds other modules)
    or "a norm" (only a one-dimensional weight); and the last names of the linear layers
    (without embeddings and the head). A head tied to the embeddings has no tensor of its
    own but is a module (``lm_head``)."""
    params: dict[str, dict[str, int]] = {}
    blocks: set[str] = set()
    for name, tensor in tensors.items():
        module, _, param = name.rpartition(".")
        if not module:
            continue
        params.setdefault(module, {})[param] = len(tensor.shape)
        parts = module.split(".")
        blocks.update(".".join(parts[:i]) for i in range(1, len(parts)))
    heads = [m for m in params if m.rpartition(".")[2] in HEAD_NAMES]
    if not heads and tied_embeddings(config):
        params["lm_head"] = {"weight": 2}
    modules: dict[str, str] = dict.fromkeys(blocks, "a block")
    for module, held in params.items():
        layer = held.get("weight", 0) >= 2 or "in_proj_weight" in held
        modules[module] = "" if layer else ("a block" if module in blocks else "a norm")
    embedding = embedding_tensor(tensors)
    skip = {embedding.name.rpartition(".")[0]} if embedding else set()
    linear = sorted(
        {
            module.rpartition(".")[2]
            for module, what in modules.items()
            if not what
            and params.get(module, {}).get("weight") == 2  # a Conv's weight has more
            and module not in skip
            and module.rpartition(".")[2] not in HEAD_NAMES
            and not is_embedding(module.rpartition(".")[2])
            and module not in blocks
        }
    )
    return modules, linear


#: Names of the output head (the module a tied head is, with no tensor of its own).
HEAD_NAMES = ("lm_head", "embed_out", "output")


def is_embedding(name: str) -> bool:
    """An embedding table's name (``embed_tokens``, ``word_embeddings``, GPT-2's ``wte``
    and ``wpe``): a two-dimensional weight, but not a linear layer."""
    return "emb" in name or name in ("wte", "wpe")
