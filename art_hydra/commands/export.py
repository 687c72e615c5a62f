"""``art-hydra export RUN_DIR OUT_DIR``: a run's trained model as a standalone folder.

The folder loads with stock transformers (``AutoModelForCausalLM.from_pretrained`` and
``AutoTokenizer.from_pretrained``), without art_hydra or peft: a LoRA run's adapters
are merged into its base with peft (``merge_and_unload(safe_merge=True)``, in float32,
then cast to the chosen dtype); a full fine-tune's weights are written as they are.
The tokenizer (with its chat template), the generation config (EOS and pad ids) and a
small record, ``art_hydra_export.json`` (run, step, base, method, the prompt format),
go with it. ``--adapter`` writes the PEFT adapter folder instead (for
``PeftModel.from_pretrained``); a tiny-base run's base, which has no hub id, is saved
beside it in ``base/``.

The folder is written under a temporary name beside OUT_DIR and renamed into place, so
OUT_DIR is either absent or whole. An existing OUT_DIR is refused; ``--force``
replaces it only when it is an earlier export (it holds ``art_hydra_export.json``) or
empty, and never when it holds the run folder or lies in its checkpoints. Nothing else
is deleted.
"""

from __future__ import annotations

import argparse
import os
import shutil
import time
from pathlib import Path
from typing import Any

from art_hydra.commands.trained import (
    ADAPTER_BASE,
    EXPORT_RECORD,
    Source,
    Trained,
    UsageError,
    as_command,
    base_name,
    describe,
    locate,
    write_json,
)
from art_hydra.config import secrets
from art_hydra.config.run_files import EXPORT

DTYPES = ("auto", "float32", "bfloat16", "float16")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="art-hydra export",
        description=(
            "Write a run's trained model as a standalone from_pretrained folder (LoRA "
            "merged into the base; tokenizer, chat template and generation config "
            "included), loadable by transformers without art_hydra or peft."
        ),
    )
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (outputs/<date>/<time>)")
    p.add_argument("out_dir", metavar="OUT_DIR", help="the folder to write (must not exist)")
    p.add_argument(
        "--checkpoint",
        metavar="STEP|PATH",
        help="a step number or checkpoint folder (default: the latest intact checkpoint)",
    )
    p.add_argument(
        "--adapter",
        action="store_true",
        help="write only the LoRA adapter folder (for peft.PeftModel.from_pretrained)",
    )
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="auto",
        help="weights' dtype (auto: the run's model.dtype, else the base's own)",
    )
    p.add_argument(
        "--force", action="store_true", help="replace OUT_DIR if it is an earlier export"
    )
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model's own code (auto_map), if the run's model needed it; a run "
        "folder's config never allows it",
    )
    return p


def main(argv: list[str]) -> int:
    """The command; user mistakes are one line on stderr and status 2."""
    args = parser().parse_args(argv)

    def body() -> int:
        out = export(
            args.run_dir,
            args.out_dir,
            checkpoint=args.checkpoint,
            adapter=args.adapter,
            dtype=args.dtype,
            force=args.force,
            trust_remote_code=args.trust_remote_code,
        )
        print(out["message"])
        return 0

    return as_command("export", body)


def check_out_dir(out: Path, source: Source, force: bool) -> None:
    """Refuse an OUT_DIR that exists (unless ``force`` and it is an earlier export or
    empty), or that would hold or sit inside what the run keeps."""
    resolved = out.resolve()
    if source.run_dir is not None:
        run = source.run_dir.resolve()
        checkpoints = (run / source.cfg.checkpoint.dir).resolve()
        if resolved == run or run.is_relative_to(resolved):
            raise UsageError(f"OUT_DIR {out} holds the run folder {run}; choose a new folder")
        if resolved.is_relative_to(checkpoints):
            raise UsageError(
                f"OUT_DIR {out} lies in the run's checkpoints ({checkpoints}); choose another "
                f"folder, for example {run / EXPORT}"
            )
        if resolved.is_relative_to(run) and resolved != run / EXPORT:
            # Any other name in the run folder is one no run writes: the folder would no
            # longer be taken for a run folder, and resuming it would be refused.
            raise UsageError(
                f"OUT_DIR {out} lies in the run folder, where only {run / EXPORT} is an "
                "export's place (a run folder holds only what runs write); choose "
                f"{run / EXPORT} or a folder outside the run"
            )
    if resolved == source.folder.resolve() or source.folder.resolve().is_relative_to(resolved):
        raise UsageError(f"OUT_DIR {out} holds the model being exported; choose a new folder")
    if not os.path.lexists(out):
        if not out.parent.is_dir():
            raise UsageError(f"OUT_DIR {out}: its parent folder {out.parent} does not exist")
        return
    if not force:
        raise UsageError(f"OUT_DIR {out} exists; choose a new folder, or --force to replace it")
    if out.is_symlink() or not out.is_dir():
        raise UsageError(f"OUT_DIR {out} is not a folder (a link or a file); it is left alone")
    if not (out / EXPORT_RECORD).is_file() and any(out.iterdir()):
        raise UsageError(
            f"OUT_DIR {out} exists and is not an export (no {EXPORT_RECORD}); --force "
            "replaces only an earlier export or an empty folder, so it is left alone"
        )


def export(
    run_dir: str | Path,
    out_dir: str | Path,
    checkpoint: str | None = None,
    adapter: bool = False,
    dtype: str = "auto",
    force: bool = False,
    trust_remote_code: bool = False,
) -> dict[str, Any]:
    """Export ``run_dir``'s trained model (see the module docstring); the record
    written, with ``message`` (what to run next) and ``seconds`` added."""
    from art_hydra.commands import trained as trained_mod

    started = time.perf_counter()
    source = locate(run_dir, checkpoint)
    if source.kind != "checkpoint":
        raise UsageError(
            f"{source.folder} is an export folder already; export a run folder (RUN_DIR)"
        )
    if adapter and not source.is_lora:
        raise UsageError(
            f"--adapter: {source.run_dir} trained every weight (model.finetune=full), so it "
            "has no adapter; export it without --adapter"
        )
    trained_mod.remote_code_refusal(source, trust_remote_code)  # only the flag allows it
    out = Path(out_dir).expanduser()
    check_out_dir(out, source, force)
    loaded = trained_mod.load(source, trust_remote_code=trust_remote_code)
    target = _dtype(dtype, loaded)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if os.path.lexists(tmp):
        raise UsageError(f"{tmp} is in the way (left by an earlier export?); remove it")
    tmp.mkdir()
    try:
        if adapter:
            method = _write_adapter(loaded, tmp, out, target)
        else:
            method = _write_merged(loaded, tmp, target)
        record = _record(source, method, target, adapter)
        write_json(tmp / EXPORT_RECORD, secrets.scrub_data(record))  # no value read from env
        _replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    record["seconds"] = time.perf_counter() - started
    record["message"] = secrets.scrub(_next_steps(out, source, adapter, record["seconds"]))
    return record


def _dtype(name: str, loaded: Trained) -> Any:
    import torch

    if name == "auto":
        return loaded.native_dtype or torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def _write_merged(loaded: Trained, folder: Path, dtype: Any) -> str:
    """Merge (LoRA) in float32, cast, and save model, tokenizer and generation config."""
    model = loaded.model
    method = "full"
    if loaded.tuner is not None:
        model = loaded.tuner.merge_and_unload(safe_merge=True)
        method = "lora-merged"
    _keep_trained_head(model)
    model = model.to(dtype)
    _settle_generation(model, loaded.tokenizer)
    model.config.name_or_path = ""
    model.save_pretrained(folder, safe_serialization=True)
    loaded.tokenizer.save_pretrained(folder)
    return method


def _keep_trained_head(model: Any) -> None:
    """A head trained apart from the embeddings it was tied to (LoRA's
    ``modules_to_save=[lm_head]`` on a tied family) must stay apart: with
    ``tie_word_embeddings`` left true, transformers would tie it back on loading and
    drop the trained head."""
    import torch

    config = model.config
    text = getattr(config, "get_text_config", lambda: config)()
    if not getattr(text, "tie_word_embeddings", False):
        return
    head, embed = model.get_output_embeddings(), model.get_input_embeddings()
    if head is None or embed is None or head.weight is embed.weight:
        return
    if not torch.equal(head.weight, embed.weight):
        text.tie_word_embeddings = False
        config.tie_word_embeddings = False


def _settle_generation(model: Any, tokenizer: Any) -> None:
    """EOS and pad ids in the generation config, so stock ``generate`` stops where the
    run's sampler stopped (at the tokenizer's EOS) and pads without a warning."""
    from transformers import GenerationConfig

    generation = getattr(model, "generation_config", None) or GenerationConfig()
    if generation.eos_token_id is None:
        generation.eos_token_id = tokenizer.eos_token_id
    if generation.pad_token_id is None:
        generation.pad_token_id = tokenizer.pad_token_id
    if generation.bos_token_id is None and tokenizer.bos_token_id is not None:
        generation.bos_token_id = tokenizer.bos_token_id
    model.generation_config = generation


def _write_adapter(loaded: Trained, folder: Path, out: Path, dtype: Any) -> str:
    """The PEFT adapter folder (+ tokenizer); a tiny base saved in ``base/`` beside it,
    with ``base_model_name_or_path`` naming that folder (absolute, at OUT_DIR)."""
    from art_hydra.config.schema import ModelSource
    from art_hydra.engine.backends.adapters import ADAPTER, save_adapters

    cfg = loaded.source.cfg
    assert loaded.tuner is not None
    lora_config = loaded.tuner.peft_config[ADAPTER]
    if cfg.model.source == ModelSource.tiny:
        base_folder = folder / ADAPTER_BASE
        base_folder.mkdir()
        base = _unadapted_base(loaded)
        _settle_generation(base, loaded.tokenizer)
        base.to(dtype).save_pretrained(base_folder, safe_serialization=True)
        loaded.tokenizer.save_pretrained(base_folder)
        # Where the base is while the adapter is saved (peft reads its config), then
        # where it will be once the folder is renamed into place.
        lora_config.base_model_name_or_path = str(base_folder)
        save_adapters(loaded.tuner, folder)
        lora_config.base_model_name_or_path = str((out / ADAPTER_BASE).resolve())
        lora_config.save_pretrained(str(folder))
    else:
        lora_config.base_model_name_or_path = str(cfg.model.name)
        lora_config.revision = cfg.model.revision
        save_adapters(loaded.tuner, folder)
    loaded.tokenizer.save_pretrained(folder)
    return "lora-adapter"


def _unadapted_base(loaded: Trained) -> Any:
    """The tiny base the run started from, built again from its config and seed (the
    loaded model carries the adapters in place)."""
    from art_hydra.engine.backends.tiny import build_model

    cfg = loaded.source.cfg
    return build_model(cfg.model, loaded.tokenizer, cfg.seed)


def _record(source: Source, method: str, dtype: Any, adapter: bool) -> dict[str, Any]:
    from importlib.metadata import PackageNotFoundError, version

    try:
        made_by = version("art_hydra")
    except PackageNotFoundError:  # a source checkout that was never installed
        made_by = None
    cfg = source.cfg
    return {
        "run_dir": str(source.run_dir),
        "checkpoint": str(source.folder),
        "step": source.step,
        "base": base_name(cfg),
        "finetune": cfg.model.finetune.name,
        "method": method,
        "dtype": str(dtype).removeprefix("torch."),
        "algorithm": cfg.algorithm.name.name,
        "task": str(cfg.task.name),
        # How the run formatted prompts, so art-hydra generate formats them the same.
        "system_prompt": cfg.task.get("system_prompt") or None,
        "max_completion_length": int(cfg.rl.max_completion_length),
        "art_hydra_version": made_by,
        "adapter_only": adapter,
    }


def _replace(tmp: Path, out: Path) -> None:
    """Rename ``tmp`` to ``out``; an earlier export there (checked by the caller) is
    renamed aside first and deleted after, so a kill leaves one whole folder."""
    if os.path.lexists(out):
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        os.replace(tmp, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


def _next_steps(out: Path, source: Source, adapter: bool, seconds: float) -> str:
    what = "adapter" if adapter else "model"
    lines = [
        f"art_hydra: exported {describe(source)} as a standalone {what} to {out} ({seconds:.1f}s)"
    ]
    if adapter:
        base = (
            f'AutoModelForCausalLM.from_pretrained("{out / ADAPTER_BASE}")'
            if (out / ADAPTER_BASE).is_dir()
            else f'AutoModelForCausalLM.from_pretrained("{source.cfg.model.name}")'
        )
        lines.append(f'Load it with peft: PeftModel.from_pretrained({base}, "{out}")')
    else:
        lines.append(
            f'Load it with transformers: AutoModelForCausalLM.from_pretrained("{out}"), '
            f'AutoTokenizer.from_pretrained("{out}")'
        )
        lines.append(f'Try it: art-hydra generate {out} -p "<prompt>"')
    return "\n".join(lines)


def __getattr__(name: str) -> Any:
    """Names that left this module when the package got its rooms (:mod:`art_hydra.moved`)."""
    from art_hydra import moved

    return moved.old_attribute(__name__, name)
