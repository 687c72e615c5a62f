"""Find and load a run's trained model: the run folder, one of its checkpoints, or an
export folder (:mod:`art_hydra.export`), for ``art-hydra export`` and ``art-hydra
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
    """``run_config.yaml`` typed by the schema (enums as enums), or a :class:`UsageError`."""
    from omegaconf import OmegaConf

    from art_hydra.config.schema import RunConfig

    path = run_dir / RUN_CONFIG
    try:
        saved = OmegaConf.load(path)
        return OmegaConf.merge(OmegaConf.structured(RunConfig), saved)
    except Exception as exc:  # a config another version wrote, or an edited one
        raise UsageError(
            f"{path} cannot be read as a run config of this art_hydra: {exc}".rstrip()
        ) from None


def locate(path: str | Path, checkpoint: str | None = None) -> Source:
    """The trained model ``path`` names: a run folder (its latest intact checkpoint, or
    ``checkpoint``: a step number or a checkpoint folder), a checkpoint folder of a run,
    or an export folder. Every mistake is a :class:`UsageError` naming what to give."""
    from art_hydra.run_folder import checkpoint_step

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
    from art_hydra.run_folder import checkpoint_step, latest_intact, verify

    cfg = read_run_config(run_dir)
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


def load(
    source: Source, device: str = "cpu", float32: bool = True, trust_remote_code: bool = False
) -> Trained:
    """Load ``source``'s trained model on ``device`` (weights in float32 unless
    ``float32=False``, which keeps the stored dtype), for merging or sampling."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line per command, not a bar per load
    trust = trust_remote_code or bool(source.cfg is not None and source.cfg.model.trust_remote_code)
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

    from art_hydra.backends.adapters import add_lora, load_adapters
    from art_hydra.config.schema import ModelSource

    cfg = source.cfg
    if cfg.model.source == ModelSource.tiny:
        from art_hydra.backends.tiny import build_model

        base = build_model(cfg.model, tokenizer, cfg.seed)
    else:
        from art_hydra.backends.torch_backend import load_base

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
