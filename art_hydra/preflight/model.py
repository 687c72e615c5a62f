"""A pretrained model's files, checked before anything loads them (no torch, no
transformers): the folder (local, or a hub id's snapshot in the local cache) holds a
``config.json`` whose ``model_type`` the installed transformers knows and whose position
limit fits ``model.max_seq_length``; safetensors weights whose shards are all there,
whose headers read and fill their files, and whose embedding shape matches the config;
a tokenizer that loads, with an EOS and a pad id (or one derived from EOS, as the torch
backend derives it at load). It also holds the rules that need the folder: top-p over
the tokens the sampler can draw, and a head trained in full on tied embeddings. A hub id
the cache lacks is :mod:`.hub`'s.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from art_hydra import folder_tokenizer, model_files
from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import AlgorithmName, FinetuneMethod, ModelSource
from art_hydra.model_files import FolderError
from art_hydra.model_files import looks_local as _looks_local
from art_hydra.preflight.common import top_p_problems, world_problem
from art_hydra.preflight.hub import download_command, uncached_problems
from art_hydra.safe_paths import file_refusal, path_refusal

#: Weight files that unpickle arbitrary objects when loaded: never loaded.
PICKLE_WEIGHTS = ("*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl")
#: Names of the output head a LoRA run may train in full (modules_to_save).
HEAD_NAMES = ("lm_head", "embed_out", "output")
#: Families whose rollouts the sampler cannot produce, with why (found on tiny
#: random-weight models of transformers 5.25): their state between decoding steps is not
#: a cache the model returns, or their step kernel fails. SFT reads whole sequences in
#: one forward and trains them (tests/preflight/test_model_preflight.py).
NO_SAMPLING = {
    "recurrent_gemma": "keeps its recurrent state inside its own layers and returns no cache",
    "rwkv": "returns its recurrent state as `state`, not a cache the sampler can carry from "
    "one decoding step to the next",
    "xlstm": "fails in transformers' own inference step kernel on CPU (matC_old has wrong "
    "shape) at every size tried",
}


def model_problems(cfg: DictConfig) -> list[Problem]:
    """A pretrained model's name: in the hub cache when offline, or a local folder with a
    config and safetensors weights. Any ``OSError`` from the file system (a path no file
    can have, a folder that cannot be read) becomes a problem naming ``model.name``."""
    model = cfg.model
    if model.source != ModelSource.pretrained:
        return []
    name = str(model.name)
    refusal = path_refusal(os.path.expanduser(name))
    if refusal is None:
        try:
            return _model_problems(cfg, name)
        except OSError as exc:
            refusal = f"cannot be read ({exc.strerror or exc})"
    return [
        world_problem(
            "model.name",
            name,
            f"{refusal}.",
            fix({"model.name": placeholder("a hub id or the path of a local model folder")}),
        )
    ]


def _model_problems(cfg: DictConfig, name: str) -> list[Problem]:
    if not _looks_local(name):
        return _hub_problems(cfg, name)
    folder = Path(os.path.expanduser(name))
    if not folder.is_dir():
        return [
            world_problem(
                "model.name",
                name,
                "looks like a local path, but no such folder exists"
                + ("" if folder.is_absolute() else f" (relative to {os.getcwd()})")
                + ".",
                fix({"model.name": placeholder("the absolute path of your model folder")}),
            )
        ]
    return folder_problems(cfg, folder, name)


def _hub_problems(cfg: DictConfig, name: str) -> list[Problem]:
    """A hub id: checked in its cached snapshot, found without any network call."""
    snapshot = model_files.cached_snapshot(name, cfg.model.revision)
    if snapshot is not None:
        return folder_problems(cfg, snapshot, name)
    return uncached_problems(cfg, name)


def _name_problem(name: str, reason: str, note: str, warning: bool = False) -> Problem:
    return world_problem("model.name", name, reason, fix(note=note), warning=warning)


_RESAVE = "point model.name at a folder save_pretrained wrote"


def _again(name: str) -> str:
    """How to get a whole copy: the hub's download command for a hub id."""
    if _looks_local(name):
        return "copy or save the folder again"
    return f"{download_command(name, None)} again (it fetches what is missing or broken)"


def folder_problems(cfg: DictConfig, folder: Path, name: str) -> list[Problem]:
    """Every check of a model folder's files, each problem naming ``model.name``."""
    config_refusal = file_refusal(folder / "config.json")
    if config_refusal == "does not exist":
        return [
            _name_problem(
                name, "is a folder without config.json, so it holds no Hugging Face model.", _RESAVE
            )
        ]
    if config_refusal is not None:
        return [_name_problem(name, f"holds a config.json that {config_refusal}.", _RESAVE)]
    try:
        config = model_files.read_json_file(folder / "config.json")
    except FolderError as exc:
        return [_name_problem(name, f"holds a config.json that cannot be used: {exc}.", _RESAVE)]
    if not isinstance(config, dict):
        return [_name_problem(name, "holds a config.json that is not a JSON object.", _RESAVE)]
    problems = _type_problems(cfg, config, name)
    problems += sampling_problems(cfg, config, name)
    problems += _position_problems(cfg, config, name)
    problems += _weight_problems(config, folder, name)
    tokenizer, found = _tokenizer_problems(cfg, config, folder, name)
    problems += found
    if cfg.algorithm.name == AlgorithmName.rl:
        problems += _top_p(cfg, config, tokenizer)
    return problems + tied_head_problems(cfg, config)


def _type_problems(cfg: DictConfig, config: dict[str, Any], name: str) -> list[Problem]:
    """``model_type`` names a config class of the installed transformers (or the folder
    ships its own code, and the user trusts it)."""
    model_type = config.get("model_type")
    if cfg.model.trust_remote_code and "auto_map" in config:
        return []
    known = model_files.known_model_types()
    if known is None:
        return []
    if not isinstance(model_type, str) or not model_type:
        return [
            _name_problem(
                name,
                "holds a config.json without a model_type, so transformers cannot tell which "
                "architecture to build.",
                'add "model_type" (for example "llama") to its config.json, or ' + _RESAVE,
            )
        ]
    if model_type in known:
        causal = model_files.causal_lm_model_types()
        if causal is None or model_type in causal:
            return []
        return [
            _name_problem(
                name,
                f"has model_type={model_type!r}, which the installed transformers knows but "
                "cannot build as a causal language model (AutoModelForCausalLM has no class "
                "for it: an encoder, a vision or an audio model), so loading it would fail.",
                "point model.name at a decoder (causal LM) checkpoint, such as a Llama, Qwen, "
                "Mistral or Gemma folder",
            )
        ]
    return [
        _name_problem(
            name,
            f"has model_type={model_type!r} in its config.json, which the installed "
            f"transformers ({len(known)} model types) does not know: loading it would fail.",
            "pip install -U transformers (a newer release may know it), or fix the model_type, "
            "or model.trust_remote_code=true if the folder ships its own modeling code",
        )
    ]


def sampling_problems(cfg: DictConfig, config: dict[str, Any], name: str) -> list[Problem]:
    """An RL run on a family whose rollouts cannot be sampled: refused before the model
    loads (the run would otherwise stop at the first prompt pass, after loading)."""
    model_type = config.get("model_type")
    if cfg.algorithm.name != AlgorithmName.rl or model_type not in NO_SAMPLING:
        return []
    return [
        world_problem(
            "algorithm",
            "rl",
            f"cannot sample rollouts from {name}: its family ({model_type}) "
            f"{NO_SAMPLING[model_type]}. Fine-tuning it with SFT needs no sampling.",
            fix({"algorithm": "sft"}, "supervised fine-tuning on the task's answers"),
        )
    ]


def _position_problems(cfg: DictConfig, config: dict[str, Any], name: str) -> list[Problem]:
    """``model.max_seq_length`` within the model's positions: a longer sequence indexes
    past the position table (an IndexError mid-run) or runs on untrained positions. Left
    null, the length is derived within the positions, and what is held against them is
    what the run will really feed the model: the data's sequences."""
    found = model_files.position_limit(config)
    if found is None:
        return []
    key, positions = found
    limit = cfg.model.max_seq_length
    if limit is None:
        return _derived_problems(cfg, key, positions, name)
    if limit <= positions:
        return []
    sets: dict[str, int] = {"model.max_seq_length": positions}
    if cfg.algorithm.name == AlgorithmName.rl:
        prompt, completion = cfg.rl.max_prompt_length, cfg.rl.max_completion_length
        if prompt + completion > positions:
            # The prompts the data really has, where they can be measured: the budget
            # must hold the longest (a blind split would only move the refusal there).
            longest = _longest_prompt(cfg)
            if longest is not None and longest >= positions:
                return [
                    world_problem(
                        "model.max_seq_length",
                        limit,
                        f"is longer than the {positions} positions of {name} (config.json "
                        f"{key}={positions}), and the data's longest prompt alone takes "
                        f"{longest} tokens: no budget within the model's positions holds it.",
                        fix(note="shorten or drop the longest prompts, or another model"),
                    )
                ]
            keep = min(prompt, positions // 2) if longest is None else max(longest, 1)
            completion = max(1, positions - keep)
            sets["rl.max_prompt_length"] = positions - completion
            sets["rl.max_completion_length"] = completion
    elif cfg.sft.max_length > positions:
        sets["sft.max_length"] = positions
    return [
        world_problem(
            "model.max_seq_length",
            limit,
            f"is longer than the {positions} positions of {name} (config.json {key}={positions}): "
            "a longer sequence would index past its position table and crash mid-run.",
            fix(sets, "the budgets within the model's positions, together"),
        )
    ]


def _derived_problems(cfg: DictConfig, key: str, positions: int, name: str) -> list[Problem]:
    """``model.max_seq_length=null`` (derived: at most the model's positions): the
    sequences the data makes must fit those positions. Measured data decides (a budget
    the data never fills costs nothing); unmeasured, budgets past the positions are a
    warning, since the rows may or may not reach them."""
    where = f"the {positions} positions of {name} (config.json {key}={positions})"
    measured = _measured(cfg)
    if cfg.algorithm.name == AlgorithmName.rl:
        completion = cfg.rl.max_completion_length
        prompt = measured.prompt.size if measured is not None else cfg.rl.max_prompt_length
        if prompt + completion <= positions:
            return []
        what = (
            f"the data's longest prompt ({measured.prompt.where}) takes {prompt} tokens"
            if measured is not None
            else f"rl.max_prompt_length={prompt}"
        )
        remedy = (
            fix({"rl.max_completion_length": positions - prompt}, "completions that fit")
            if prompt < positions
            else fix(note="shorten or drop the longest prompts, or use a model with more positions")
        )
        return [
            world_problem(
                "rl.max_completion_length",
                completion,
                f"does not fit {where}: {what}, and with {completion} completion tokens a "
                "rollout would index past the position table (a crash mid-run) or run on "
                "untrained positions.",
                remedy,
                warning=measured is None,
            )
        ]
    if measured is not None:
        if measured.example.size <= positions:
            return []
        return [
            world_problem(
                "sft.max_length",
                cfg.sft.max_length,
                f"admits the data's longest example ({measured.example.where}), "
                f"{measured.example.size} tokens, which is longer than {where}: it cannot be "
                "trained on without cutting it.",
                fix(
                    note="shorten or drop the longest examples, or use a model with more positions"
                ),
            )
        ]
    if cfg.sft.max_length <= positions:
        return []
    return [
        world_problem(
            "sft.max_length",
            cfg.sft.max_length,
            f"is longer than {where}, and the examples cannot be measured before the "
            "tokenizer loads: one longer than the positions would stop the run.",
            fix({"sft.max_length": positions}),
            warning=True,
        )
    ]


def _measured(cfg: DictConfig) -> Any:
    """The task data measured in the model's tokens, chat template included
    (:class:`~art_hydra.preflight.lengths.Lengths`; None: not measurable before loading,
    or the data cannot be read: the task check says why)."""
    from art_hydra.preflight import lengths
    from art_hydra.tasks.base import iter_examples
    from art_hydra.tasks.jsonl import Scan

    try:
        measured = lengths.measure(cfg, iter_examples(cfg, Scan()))
    except Exception:  # the task check reports what is wrong with the data or its code
        return None
    if measured is None or measured.overrun or not measured.prompt.size:
        return None
    return measured


def _longest_prompt(cfg: DictConfig) -> int | None:
    """The data's longest prompt in the model's tokens (None: not measured)."""
    measured = _measured(cfg)
    return measured.prompt.size if measured is not None else None


def _weight_problems(config: dict[str, Any], folder: Path, name: str) -> list[Problem]:
    safe = list(folder.glob("*.safetensors"))
    pickled = [p.name for pattern in PICKLE_WEIGHTS for p in folder.glob(pattern)]
    index = (folder / "model.safetensors.index.json").exists()
    if not safe and not index and pickled:
        return [
            _name_problem(
                name,
                f"holds only pickled weights ({', '.join(sorted(pickled))}); loading a pickle can "
                "run arbitrary code, so art_hydra loads weights only from safetensors.",
                "convert once, where you trust the file: AutoModelForCausalLM."
                "from_pretrained(folder).save_pretrained(folder, safe_serialization=True)",
            )
        ]
    if not safe and not index:
        note = _RESAVE if _looks_local(name) else _again(name)
        return [_name_problem(name, "holds no weights (*.safetensors).", note)]
    try:
        files, missing = model_files.weight_files(folder)
        if missing:
            shown = ", ".join(missing[:3]) + (
                f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            )
            return [
                _name_problem(
                    name,
                    f"lacks {len(missing)} of the {len(files)} weight shards its "
                    f"model.safetensors.index.json lists ({shown}): an interrupted download or "
                    "copy.",
                    _again(name),
                )
            ]
        tensors: dict[str, model_files.Tensor] = {}
        for shard in files:
            tensors.update(model_files.read_header(folder / shard))
    except FolderError as exc:
        return [
            _name_problem(
                name,
                f"holds weights that cannot be loaded: {exc}.",
                _again(name),
            )
        ]
    return [
        _name_problem(
            name,
            f"holds weights that do not match its config: {mismatch}; the model would not load "
            "as it was saved.",
            "use the config.json saved with these weights",
        )
        for mismatch in model_files.shape_mismatches(config, tensors)
    ]


def _tokenizer_problems(
    cfg: DictConfig, config: dict[str, Any], folder: Path, name: str
) -> tuple[Any, list[Problem]]:
    """The tokenizer files: present, loadable, with an EOS and a pad id (or one derived
    from EOS, as the torch backend derives it)."""
    unreadable = _tokenizer_files_problem(folder, name)
    if unreadable is not None:
        return None, [unreadable]
    try:
        tokenizer = folder_tokenizer.load(folder)
    except FolderError as exc:
        return None, [
            _name_problem(name, f"holds a tokenizer that cannot be loaded: {exc}.", _RESAVE)
        ]
    problems = _eos_problems(tokenizer, folder, config, name)
    vocab = model_files.vocab_size(config)
    if vocab is not None and len(tokenizer) > vocab:
        problems.append(
            _name_problem(
                name,
                f"has a tokenizer of {len(tokenizer)} tokens but config.json vocab_size={vocab}: "
                "ids past the embedding table would crash the run.",
                "use the tokenizer saved with this model (or resize its embeddings and save)",
            )
        )
    return tokenizer, problems


def _tokenizer_files_problem(folder: Path, name: str) -> Problem | None:
    """Why the folder's tokenizer cannot be read here (no files; a tokenizer.model with
    neither package that reads it), or a warning that it is read only after the check
    (no tokenizer.json); None for a tokenizer.json, which the check reads itself."""
    kind = folder_tokenizer.has_tokenizer_files(folder)
    if kind is None:
        return _name_problem(
            name,
            "holds no tokenizer files (tokenizer.json, or tokenizer.model / vocab.json + "
            "merges.txt), so no tokenizer can be loaded from it.",
            "save the tokenizer next to the model: AutoTokenizer.from_pretrained(<the base "
            "model>).save_pretrained(folder)",
        )
    if kind == "sentencepiece" and not any(
        importlib.util.find_spec(m) for m in ("sentencepiece", "tiktoken")
    ):
        return _name_problem(
            name,
            "holds only a tokenizer.model (no tokenizer.json), which transformers reads "
            "with the sentencepiece or tiktoken package, and neither is installed here: "
            "the tokenizer could not load.",
            "pip install sentencepiece (then run again), or save the tokenizer with "
            "tokenizer.json where it loads: AutoTokenizer.from_pretrained(folder)."
            "save_pretrained(folder)",
        )
    if kind != "json":
        return _name_problem(
            name,
            "holds a tokenizer without tokenizer.json (only "
            + ("tokenizer.model" if kind == "sentencepiece" else "vocab.json + merges.txt")
            + "): prompt and answer lengths, EOS and pad are checked only after it loads.",
            "save it once with AutoTokenizer.from_pretrained(folder).save_pretrained(folder), "
            "which writes tokenizer.json",
            warning=True,
        )
    return None


def _eos_problems(tokenizer: Any, folder: Path, config: dict[str, Any], name: str) -> list[Problem]:
    """No EOS anywhere (a completion could never end), or one taken from elsewhere than
    the tokenizer's own config (said, since it also becomes the pad token)."""
    eos = folder_tokenizer.eos_token(tokenizer, folder, config)
    if eos is None:
        return [
            _name_problem(
                name,
                "has a tokenizer with no EOS token (tokenizer_config.json eos_token, "
                "generation_config.json or config.json eos_token_id): a completion could never "
                "end, and with no pad token either, batches could not be padded.",
                'add "eos_token": "<the token that ends a turn>" to its tokenizer_config.json',
            )
        ]
    if eos[1] != "tokenizer_config.json":
        return [
            _name_problem(
                name,
                f"has a tokenizer with no eos_token of its own: the run takes {eos[0]!r} from "
                f"{eos[1]} as EOS"
                + ("" if tokenizer.specials.get("pad_token") else " and as the pad token")
                + ".",
                f'add "eos_token": {eos[0]!r} to its tokenizer_config.json to say so',
                warning=True,
            )
        ]
    return []


def _top_p(cfg: DictConfig, config: dict[str, Any], tokenizer: Any) -> list[Problem]:
    """Top-p over the tokens the sampler can draw: the model's logits (config
    vocab_size) less the special ids it never samples (pad, BOS, unknown; not EOS)."""
    vocab = model_files.vocab_size(config)
    if vocab is None:
        return []
    never = set()
    if tokenizer is not None:
        eos = tokenizer.token_id("eos_token")
        for name in ("pad_token", "bos_token", "unk_token"):
            token_id = tokenizer.token_id(name)
            if token_id is not None and token_id != eos and token_id < vocab:
                never.add(token_id)
    what = f"config.json vocab_size={vocab}" + (
        f" less {len(never)} special id(s) it never samples: pad, BOS, unknown" if never else ""
    )
    return top_p_problems(cfg, vocab - len(never), what)


def tied_head_problems(cfg: DictConfig, config: dict[str, Any]) -> list[Problem]:
    """``modules_to_save`` with the head on a model whose head is its embedding matrix:
    peft trains (and saves with every checkpoint) a full untied copy of it."""
    model = cfg.model
    if model.finetune != FinetuneMethod.lora or not model_files.tied_embeddings(config):
        return []
    saved = list(model.lora.modules_to_save)
    heads = [m for m in saved if m in HEAD_NAMES]
    if not heads:
        return []
    vocab, hidden = model_files.vocab_size(config), model_files.hidden_size(config)
    size = f"{vocab * hidden[1]:,} parameters, " if vocab and hidden else ""
    rest = [m for m in saved if m not in heads]
    return [
        world_problem(
            "model.lora.modules_to_save",
            saved,
            f"trains {heads[0]} in full, but this model ties its head to the input embeddings "
            f"(config.json tie_word_embeddings, true unless it says false): peft makes a full "
            f"untied copy of the embedding matrix ({size}vocab_size x hidden size) that trains "
            "and is saved with every checkpoint, while the embeddings stay as they were.",
            fix({"model.lora.modules_to_save": rest}, "LoRA adapters only"),
            warning=True,
        )
    ]
