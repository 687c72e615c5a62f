"""Find and load a run's trained model: the run folder, one of its checkpoints, or an
export folder (:mod:`art_hydra.commands.export`), for ``art-hydra export`` and ``art-hydra
generate``.

A run folder says what it trained in ``run_config.yaml``: the base model (the tiny
Llama built from ``model.tiny`` and the seed, or ``model.name`` for a pretrained one)
and whether it trained LoRA adapters or every weight. A checkpoint holds only what
trained (the adapters, or the whole model) and the tokenizer, so a LoRA run's base is
rebuilt (tiny) or loaded again (pretrained) exactly as the run did, the adapters added
by the same code and their weights read back. Weights are read from safetensors only,
and a checkpoint is verified against its manifest before anything is loaded.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import CompactHydraException

from art_hydra.config.run_files import CHECKPOINT_PREFIX, RUN_CONFIG, checkpoint_name

#: The record an export folder holds: which run, step, base and method it came from.
EXPORT_RECORD = "art_hydra_export.json"
#: Where an export of a tiny-base LoRA run with ``--adapter`` keeps the base (it has no
#: hub id that ``PeftModel`` could load it from).
ADAPTER_BASE = "base"


class UsageError(CompactHydraException, ValueError):
    """A user's mistake on the command line (no such folder, no checkpoint, an output
    folder in the way): one message, exit status 2, no traceback."""

    exit_code = 2


def as_command(name: str, body: Callable[[], int]) -> int:
    """Run ``art-hydra <name>``'s body: a user's mistake is one line on stderr and status 2,
    a known refusal while loading (a base without its weights) its message and status 1;
    anything else is a bug and keeps its traceback."""
    from art_hydra.errors import full_error

    try:
        return body()
    except UsageError as exc:
        sys.stderr.write(f"art-hydra {name}: {exc}\n")
        return 2
    except CompactHydraException as exc:
        if full_error():
            raise
        sys.stderr.write(f"art-hydra {name}: {str(exc).rstrip()}\n")
        return 1


@dataclass
class Source:
    """Where a trained model is: a checkpoint of a run, or an export folder."""

    #: ``"checkpoint"`` (of a run) or ``"export"`` (a standalone ``from_pretrained`` folder).
    kind: str
    #: The folder the weights and tokenizer are read from.
    folder: Path
    #: The run folder (None for an export whose run is not known).
    run_dir: Path | None = None
    #: The run's resolved config (None for an export).
    cfg: Any = None
    #: The optimizer step the weights are from (None when unknown).
    step: int | None = None
    #: An export folder's record (empty for a checkpoint).
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def is_lora(self) -> bool:
        from art_hydra.config.schema import FinetuneMethod

        return self.cfg is not None and self.cfg.model.finetune == FinetuneMethod.lora

    @property
    def system_prompt(self) -> str | None:
        """The run's ``task.system_prompt``: prompts are formatted as the run's were."""
        if self.cfg is not None:
            return self.cfg.task.get("system_prompt") or None
        return self.record.get("system_prompt") or None

    @property
    def max_new_tokens(self) -> int | None:
        """The run's completion budget (RL: ``rl.max_completion_length``), if known."""
        if self.cfg is not None:
            return int(self.cfg.rl.max_completion_length)
        value = self.record.get("max_completion_length")
        return int(value) if isinstance(value, int) else None


def read_run_config(run_dir: Path) -> Any:
    """``run_config.yaml`` typed by the schema (enums as enums), or a :class:`UsageError`.
    Read within bounds (size, nesting, YAML aliases): a run folder may come from anyone."""
    from omegaconf import OmegaConf

    from art_hydra.config.schema import RunConfig
    from art_hydra.config.yaml_guard import YamlRefused, load_bounded

    path = run_dir / RUN_CONFIG
    try:
        saved = load_bounded(path)
    except YamlRefused as exc:
        raise UsageError(f"{exc}; it is not read as a run config") from None
    raw = OmegaConf.to_container(saved, resolve=False)
    model = raw.get("model") if isinstance(raw, dict) else None
    reads = _interpolation(model, "model", reads_env=True) if isinstance(model, dict) else None
    if reads is not None:  # which model loads (a hub id is a request) is not the folder's
        raise UsageError(
            f"{path}: {reads[0]}={reads[1]!r} reads your environment to choose the model; a "
            "run folder is data, and the value would go where the model is looked for (a hub "
            f"id is a request to a host). Write the value itself in {path}"
        )
    where = _interpolation(raw)
    if where is not None:
        key, value = where
        raise UsageError(
            f"{path}: {key}={value!r} is an interpolation; a run saves its config resolved, "
            "so this one was edited, and resolving it could read your environment "
            "(${oc.env:...}) into what the command prints or writes. It is not read; "
            f"write the value itself in {path}"
        )
    try:
        merged = OmegaConf.merge(OmegaConf.structured(RunConfig), saved)
    except Exception as exc:  # a config another version wrote, or an edited one
        raise UsageError(
            f"{path} cannot be read as a run config of this art_hydra: {exc}".rstrip()
        ) from None
    from art_hydra.config import secrets

    secrets.remember(merged)  # what this command prints or writes never shows those values
    try:
        OmegaConf.resolve(merged)  # what the run read from the environment, read now
    except Exception as exc:
        raise UsageError(
            f"{path}: {str(exc).splitlines()[0]}: the run read it from the environment (the "
            "file keeps its ${oc.env:...} expression, never its value); set the variable as "
            "it was for the run, and run again"
        ) from None
    return merged


#: ``${oc.env:NAME}`` or ``${oc.env:NAME,default}`` (no nested interpolation).
_ENV_READ = re.compile(r"\$\{oc\.env:[^${}]*\}")


def _interpolation(node: Any, where: str = "", reads_env: bool = False) -> tuple[str, str] | None:
    """The first ``(key, value)`` of ``node`` (plain data) whose text is an interpolation
    other than an environment read (``reads_env``: any interpolation at all)."""
    if isinstance(node, dict):
        items: Any = ((f"{where}.{k}" if where else str(k), v) for k, v in node.items())
    elif isinstance(node, list):
        items = ((f"{where}[{i}]", v) for i, v in enumerate(node))
    else:
        # A run keeps what it read from the environment as ${oc.env:...}: read again now.
        text = node if reads_env or not isinstance(node, str) else _ENV_READ.sub("", node)
        unread = isinstance(node, str) and "${" in text
        return (where, node) if unread else None
    for key, value in items:
        found = _interpolation(value, key, reads_env)
        if found is not None:
            return found
    return None


def locate(path: str | Path, checkpoint: str | None = None) -> Source:
    """The trained model ``path`` names: a run folder (its latest intact checkpoint, or
    ``checkpoint``: a step number or a checkpoint folder), a checkpoint folder of a run,
    or an export folder. Every mistake is a :class:`UsageError` naming what to give."""
    from art_hydra.runs.run_folder import checkpoint_step

    folder = Path(path).expanduser()
    if not folder.exists():
        raise UsageError(f"{folder}: no such folder (give a run folder or an export folder)")
    if not folder.is_dir():
        raise UsageError(f"{folder} is a file; give a run folder or an export folder")
    if (folder / RUN_CONFIG).is_file():
        return _in_run(folder.resolve(), checkpoint)
    if checkpoint_step(folder) is not None and (folder.parent.parent / RUN_CONFIG).is_file():
        if checkpoint is not None:
            raise UsageError(f"{folder} is a checkpoint already; --checkpoint is for run folders")
        return _in_run(folder.parent.parent.resolve(), str(folder.resolve()))
    if (folder / "config.json").is_file():
        if checkpoint is not None:
            raise UsageError(
                f"{folder} is an export folder, which holds one model; --checkpoint is for "
                "run folders"
            )
        return Source("export", folder.resolve(), record=_export_record(folder))
    raise UsageError(
        f"{folder} is neither a run folder (no {RUN_CONFIG}) nor an export folder (no "
        "config.json); give the folder a run wrote (outputs/<date>/<time>) or one that "
        "art-hydra export wrote"
    )


def _export_record(folder: Path) -> dict[str, Any]:
    from art_hydra import safe_json

    path = folder / EXPORT_RECORD
    if not path.is_file():
        return {}
    try:
        record = safe_json.read(path)
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path} cannot be read: {exc}") from None
    return record if isinstance(record, dict) else {}


def _in_run(run_dir: Path, checkpoint: str | None) -> Source:
    """The checkpoint of ``run_dir`` to load, verified against its manifest."""
    from art_hydra.config.validators import _checkpoint_dir_flaw
    from art_hydra.runs.run_folder import checkpoint_step, latest_intact, verify

    cfg = read_run_config(run_dir)
    flaw = _checkpoint_dir_flaw(str(cfg.checkpoint.dir))
    if flaw is not None:  # an edited config: the checkpoints are looked for in the run only
        raise UsageError(
            f"{run_dir / RUN_CONFIG}: checkpoint.dir={cfg.checkpoint.dir} {flaw} A run's "
            "checkpoints are in a folder inside it; give a run folder as a run left it"
        )
    root = run_dir / cfg.checkpoint.dir
    if checkpoint is None:
        found, skipped = latest_intact(root)
        if found is None:
            why = f" ({skipped[0]})" if skipped else ""
            raise UsageError(
                f"{run_dir} has no complete checkpoint in {root}{why}: nothing trained was "
                "saved. Resume the run to write one (resume=true hydra.run.dir="
                f"{run_dir}), or give another run folder"
            )
        folder = found
    elif checkpoint.isdigit():
        folder = root / checkpoint_name(int(checkpoint))
        if not folder.is_dir():
            have = ", ".join(p.name for p in sorted(root.glob(f"{CHECKPOINT_PREFIX}*")))
            raise UsageError(
                f"--checkpoint {checkpoint}: {run_dir} has no {folder.name} in {root} "
                f"(it has: {have or 'none'})"
            )
    else:
        folder = Path(checkpoint).expanduser().resolve()
        if checkpoint_step(folder) is None or not folder.is_dir():
            raise UsageError(
                f"--checkpoint {checkpoint}: not a checkpoint folder ({CHECKPOINT_PREFIX}NNNNNN)"
            )
    reason = verify(folder)
    if reason is not None:
        raise UsageError(f"{folder} cannot be trusted: {reason}; choose another --checkpoint")
    return Source("checkpoint", folder, run_dir, cfg, checkpoint_step(folder))


def task_code_refusal(cfg: Any, path: Path) -> None:
    """Refuse a run config read from ``path`` (a file: a run folder's record) whose task
    names code a config file may not: a library or standard-library function, or one
    not marked for its role (``task.allowed_modules`` from a file widens nothing). The
    rules a run applies to its config files (:mod:`art_hydra.config.trust`), checked
    here to name the key; :func:`build_folder_task` enforces them while building."""
    from omegaconf import OmegaConf

    from art_hydra.config.targets import key_role, marker_in_source, refusal
    from art_hydra.config.trust import reward_keys

    keys = reward_keys(cfg)
    if str(cfg.task.source) in ("generated", "TaskSource.generated"):
        keys.append("task.generator")
    for key in keys:
        value = OmegaConf.select(cfg, key, default=None)
        if value is None:
            continue
        role = key_role(key)
        why = refusal(value, key)
        if why is None and marker_in_source(str(value), role) is not True:
            why = f"is not marked @{role} (a def decorated @{role} in its module's source)."
        if why is not None:
            raise UsageError(
                f"{path}: {key}={value} {why} A run folder's config is a file, not your "
                "command line, so it names only functions marked @reward / @generator (and "
                "art_hydra's own); its task is not built. Mark the function in its source, or "
                "give prompts with -p or --file instead of --task"
            )


def build_folder_task(cfg: Any, path: Path) -> Any:
    """The task of a run config read from ``path``, built under the trust rules of a
    config file: nothing in it counts as set by hand (``Hand()``)."""
    from art_hydra.config.trust import Hand, by_hand
    from art_hydra.tasks import build_task

    task_code_refusal(cfg, path)
    with by_hand(Hand()):
        return build_task(cfg)


@dataclass
class Trained:
    """A loaded trained model: the transformers model (with LoRA layers injected for a
    LoRA run, unmerged), its tokenizer, and where it came from."""

    model: Any
    tokenizer: Any
    source: Source
    #: peft's ``LoraModel`` over :attr:`model` (None unless a LoRA run).
    tuner: Any = None
    #: The dtype the base's weights came in (what an ``--dtype auto`` export writes).
    native_dtype: Any = None


def native_dtype(cfg: Any, loaded: Any) -> Any:
    """The dtype a run's model is meant to be used in: ``model.dtype`` when it names a
    type; with ``auto``, the dtype the base (LoRA) or checkpoint (full) was stored in."""
    import torch

    from art_hydra.config.schema import DType

    named = {
        DType.float32: torch.float32,
        DType.bfloat16: torch.bfloat16,
        DType.float16: torch.float16,
    }.get(cfg.model.dtype)
    return named or loaded


def remote_code_refusal(source: Source, trust_remote_code: bool) -> None:
    """Refuse a run folder whose saved config asks for the model's own code when the
    command line did not: a run folder is data (anyone may have written it), and
    ``model.trust_remote_code=true`` there would run the Python its checkpoint's
    ``config.json`` names (``auto_map``). Only the command's ``--trust-remote-code``
    allows that."""
    if trust_remote_code or source.cfg is None or source.cfg.model.trust_remote_code is not True:
        return
    raise UsageError(
        f"{source.run_dir / RUN_CONFIG} sets model.trust_remote_code=true: loading this run's "
        f"model would run the Python code that comes with it (model '{source.cfg.model.name}', "
        f"the auto_map of {source.folder / 'config.json'}), and a run folder cannot decide "
        "that. Pass --trust-remote-code if you trust that folder's code"
    )


def load(
    source: Source, device: str = "cpu", float32: bool = True, trust_remote_code: bool = False
) -> Trained:
    """Load ``source``'s trained model on ``device`` (weights in float32 unless
    ``float32=False``, which keeps the stored dtype), for merging or sampling. The model's
    own code runs only with ``trust_remote_code`` (the command line's flag): never
    because the run folder's config says so."""
    remote_code_refusal(source, trust_remote_code)
    if source.cfg is not None:  # the base of a pretrained LoRA run loads under the flag too
        source.cfg.model.trust_remote_code = trust_remote_code
    try:
        return _load(source, device, float32, trust_remote_code)
    except ValueError as exc:  # transformers: the folder's config names its own code
        if isinstance(exc, CompactHydraException) or "trust_remote_code" not in str(exc):
            raise
        raise UsageError(
            f"{source.folder} holds model or tokenizer code of its own (an auto_map in its "
            "config.json or tokenizer_config.json), which runs only when you allow it: pass "
            "--trust-remote-code if you trust that folder's code"
        ) from None


def _load(source: Source, device: str, float32: bool, trust: bool) -> Trained:
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per command, not a bar per load
    tokenizer = AutoTokenizer.from_pretrained(source.folder, trust_remote_code=trust)
    tokenizer.padding_side = "left"
    if source.kind == "export" or not source.is_lora:
        model = AutoModelForCausalLM.from_pretrained(
            source.folder,
            dtype="auto",
            use_safetensors=True,  # never unpickle weights
            trust_remote_code=trust,
        )
        stored = next(model.parameters()).dtype
        if float32:
            model = model.float()
        model.to(device).eval()
        native = stored if source.cfg is None else native_dtype(source.cfg, stored)
        return Trained(model, tokenizer, source, native_dtype=native)
    return _load_lora(source, tokenizer, device, float32)


def _load_lora(source: Source, tokenizer: Any, device: str, float32: bool) -> Trained:
    """The base as the run had it, LoRA layers added as the run added them, and the
    checkpoint's adapter (and ``modules_to_save``) weights read into them."""
    from safetensors.torch import load_file

    from art_hydra.config.schema import ModelSource
    from art_hydra.engine.backends.adapters import add_lora, load_adapters

    cfg = source.cfg
    if cfg.model.source == ModelSource.tiny:
        from art_hydra.engine.backends.tiny import build_model

        base = build_model(cfg.model, tokenizer, cfg.seed)
    else:
        from art_hydra.engine.backends.torch_backend import load_base

        try:
            base, _ = load_base(cfg.model, cfg.seed)
        except (OSError, ValueError) as exc:  # a moved folder; a hub id not cached
            if isinstance(exc, CompactHydraException):
                raise
            raise UsageError(
                f"the run's base model model.name={cfg.model.name} cannot be loaded from here: "
                f"{exc}".rstrip()
            ) from None
    stored = next(base.parameters()).dtype
    if float32:
        base = base.float()
    tuner = add_lora(base, cfg.model.lora, cfg.seed)
    weights = load_file(source.folder / "adapter_model.safetensors")
    unexpected = load_adapters(tuner, weights)
    if unexpected:
        raise UsageError(f"{source.folder} does not match the run's adapters: {unexpected[:5]}")
    tuner.to(device).eval()
    return Trained(tuner.model, tokenizer, source, tuner, native_dtype(cfg, stored))


def describe(source: Source) -> str:
    """One line naming what was loaded (for messages and the export record)."""
    if source.kind == "export":
        return f"export {source.folder}"
    return f"{source.run_dir} step {source.step} ({source.folder.name})"


def base_name(cfg: Any) -> str:
    """The base a run trained on: a hub id or folder, or the tiny model's description."""
    from art_hydra.config.schema import ModelSource

    if cfg.model.source == ModelSource.tiny:
        tiny = cfg.model.tiny
        return (
            f"tiny Llama built from the seed ({cfg.seed}): hidden {tiny.hidden_size}, "
            f"{tiny.num_layers} layers (no hub id)"
        )
    return str(cfg.model.name)


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
