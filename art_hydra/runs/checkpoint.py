"""Checkpoints: standard Hugging Face / PEFT folders plus each component's own state.

``checkpoints/step-000050/`` holds ``adapter_model.safetensors`` + ``adapter_config.json``
(LoRA; loadable with ``peft.PeftModel.from_pretrained``) or ``model.safetensors`` +
``config.json`` (full fine-tuning), the tokenizer, ``trainer_state/`` and a manifest.
Each component owns its state (``state_dict()`` returns tensors and JSON-able values,
``load_state_dict`` takes them back): the trainer (optimizer moments, schedule, loss
scaler, step) and the producer (data position, the rest of the current generation
batch, the sampler's random state); the process-wide random states are saved here.
Tensors go to safetensors, the rest to ``state.json``: nothing is pickled.

A checkpoint is written into a temporary folder, its manifest (every file's SHA-256)
written last, flushed, and renamed into place, all within ``timeouts.checkpoint_s``;
old checkpoints are renamed aside before they are deleted, so a kill at any moment
leaves either a whole, verifiable checkpoint or none.

The checkpoint folder is the run's own: it must not be (or lie below) a symbolic link,
and the leftovers a killed writer or pruner leaves are deleted only when their names are
exactly the ones this module gives them (``.tmp-step-NNNNNN-<pid>``,
``.trash-step-NNNNNN-<pid>``) and they are real folders, never through a link.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from art_hydra import safe_json, workers
from art_hydra.config.run_files import CHECKPOINT_PREFIX, STATE_DIR, checkpoint_name
from art_hydra.errors import StallError, WriteError
from art_hydra.runs.run_folder import (
    UnsafePath,
    checkpoint_folders,
    entry_kind,
    latest_intact,
    write_manifest,
)

if TYPE_CHECKING:
    from art_hydra.config.schema import CheckpointConfig

#: The names of the leftovers a killed writer (.tmp) or pruner (.trash) leaves behind.
_LEFTOVER = re.compile(rf"^\.(tmp|trash)-{re.escape(CHECKPOINT_PREFIX)}\d{{6,}}-\d+$")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """Flush every file of a checkpoint to disk before it is renamed into place."""
    for path in sorted(root.rglob("*"), reverse=True):
        if path.is_file():
            with open(path, "rb") as handle:
                os.fsync(handle.fileno())
        else:
            _fsync_dir(path)
    _fsync_dir(root)


def _process_rng() -> dict[str, torch.Tensor]:
    """The process-wide random states, as tensors (nothing pickled): torch's (CPU and
    each GPU), Python's ``random`` and NumPy's global generator, which a reward or a
    generator may draw from; a resumed run continues each from where it stopped."""
    import random

    rng = {"torch_cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        for index, state in enumerate(torch.cuda.get_rng_state_all()):
            rng[f"torch_cuda_{index}"] = state
    version, words, gauss = random.getstate()
    rng["python_random_words"] = torch.tensor(words, dtype=torch.int64)  # 624 words + index
    rng["python_random_version"] = torch.tensor([version], dtype=torch.int64)
    rng["python_random_gauss"] = torch.tensor(
        [0.0 if gauss is None else 1.0, gauss or 0.0], dtype=torch.float64
    )
    numpy = _numpy()
    if numpy is not None:
        kind, keys, pos, has_gauss, cached = numpy.random.get_state(legacy=True)
        if kind == "MT19937":
            rng["numpy_mt19937_keys"] = torch.tensor(keys.astype("int64"))
            rng["numpy_mt19937_pos"] = torch.tensor([pos, has_gauss], dtype=torch.int64)
            rng["numpy_mt19937_gauss"] = torch.tensor([cached], dtype=torch.float64)
    return rng


def _numpy() -> Any:
    """NumPy, when it is installed (its global generator is then part of a checkpoint)."""
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _restore_process_rng(rng: dict[str, torch.Tensor]) -> None:
    """Restore what :func:`_process_rng` saved; a checkpoint written before Python's and
    NumPy's states were saved leaves them as seeded (as resuming did then)."""
    import random

    torch.set_rng_state(rng["torch_cpu"])
    cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
    if cuda and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(cuda)
    if "python_random_words" in rng:
        has_gauss, gauss = rng["python_random_gauss"].tolist()
        random.setstate(
            (
                int(rng["python_random_version"][0]),
                tuple(int(w) for w in rng["python_random_words"].tolist()),
                gauss if has_gauss else None,
            )
        )
    numpy = _numpy()
    if numpy is not None and "numpy_mt19937_keys" in rng:
        pos, has_gauss = (int(v) for v in rng["numpy_mt19937_pos"].tolist())
        keys = rng["numpy_mt19937_keys"].numpy().astype(numpy.uint32)
        cached = float(rng["numpy_mt19937_gauss"][0])
        numpy.random.set_state(("MT19937", keys, pos, has_gauss, cached))


class Checkpointer:
    """Writes, lists, prunes and loads the checkpoints of one run (reads ``cfg.checkpoint``
    and the bound on a write)."""

    def __init__(self, run_dir: Path, checkpoint_cfg: CheckpointConfig, timeout_s: float) -> None:
        self.cfg = checkpoint_cfg
        self.run_dir = Path(run_dir)
        self.root = self.run_dir / checkpoint_cfg.dir
        self.timeout_s = timeout_s

    def _check_root(self) -> None:
        """Refuse a checkpoint folder that is, or lies below, a link or a file: writing
        and pruning there would happen outside the run folder."""
        path = self.run_dir
        for part in Path(os.path.normpath(self.cfg.dir)).parts:
            path = path / part
            kind = entry_kind(path)
            if kind not in (None, "folder"):
                raise UnsafePath(
                    f"{path} (checkpoint.dir={self.cfg.dir}) is a {kind}, not a folder of the "
                    "run: checkpoints would be written and pruned through it, outside the run "
                    "folder. Choose a fresh run folder (hydra.run.dir=...), or move it aside."
                )

    def due(self, step: int, max_steps: int) -> bool:
        every = self.cfg.every_steps
        return step == max_steps or (every > 0 and step % every == 0)

    def complete(self) -> list[Path]:
        """Checkpoints renamed into place with their manifest, oldest first by step."""
        return checkpoint_folders(self.root)

    def latest(self) -> tuple[Path | None, list[str]]:
        """The newest checkpoint that verifies, and why newer ones were skipped."""
        self._check_root()
        return latest_intact(self.root)

    def save(self, step: int, components: dict[str, Any], loaded: Any) -> Path:
        """Write step ``step`` atomically, within ``timeouts.checkpoint_s``, and prune."""
        outcome: dict[str, Any] = {}

        def write() -> None:
            try:
                outcome["path"] = self._write(step, components, loaded)
            except BaseException as exc:
                outcome["error"] = exc
                if not isinstance(exc, UnsafePath):
                    self._remove_leftover(self._tmp(step))  # give the room back

        writer = workers.start(write, "checkpoint")
        writer.join(self.timeout_s)
        previous = self.complete()
        kept = (
            f"the last complete one, {previous[-1].name}, is intact"
            if previous
            else ("there is no earlier one")
        )
        if writer.is_alive():
            raise StallError(
                f"writing checkpoint {checkpoint_name(step)} did not finish within "
                f"{self.timeout_s:g}s (timeouts.checkpoint_s); {kept}. Raise "
                "timeouts.checkpoint_s for a slow disk, then resume."
            )
        error = outcome.get("error")
        if isinstance(error, UnsafePath):
            raise error
        if isinstance(error, (OSError, SafetensorError)):  # a full disk, a read-only folder
            raise WriteError(
                f"writing checkpoint {checkpoint_name(step)} in {self.root} failed: {error}; "
                f"{kept}. Free space (or fix the folder's permissions), then resume with "
                f"resume=true hydra.run.dir={self.run_dir.resolve()} and the same overrides."
            ) from error
        if error is not None:
            raise error
        return outcome["path"]

    def _tmp(self, step: int) -> Path:
        return self.root / f".tmp-{checkpoint_name(step)}-{os.getpid()}"

    def _remove_leftover(self, path: Path) -> None:
        """Delete a leftover of this module's own making: its exact name, a real folder
        (a link or anything else under that name is left alone, never followed)."""
        if _LEFTOVER.match(path.name) and entry_kind(path) == "folder":
            shutil.rmtree(path, ignore_errors=True)

    def _write(self, step: int, components: dict[str, Any], loaded: Any) -> Path:
        self._check_root()
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / checkpoint_name(step)
        tmp = self._tmp(step)
        for stale in self.root.iterdir():
            self._remove_leftover(stale)  # left by a killed writer or pruner
        if entry_kind(final) not in (None, "folder"):
            raise UnsafePath(
                f"{final} is a {entry_kind(final)}, not a checkpoint this run wrote; it is left "
                "alone. Choose a fresh run folder (hydra.run.dir=...), or move it aside."
            )
        try:
            os.mkdir(tmp)  # exclusively: never into something already there
        except FileExistsError:
            raise UnsafePath(
                f"{tmp} is in the way (a {entry_kind(tmp)} art_hydra did not leave); it is "
                "left alone. Move it aside, then resume."
            ) from None
        loaded.save_weights(tmp)
        state_dir = tmp / STATE_DIR
        state_dir.mkdir()
        state: dict[str, Any] = {"step": step}
        for name, component in components.items():
            tensors, plain = component.state_dict()
            save_file(tensors, state_dir / f"{name}.safetensors")
            state[name] = plain
        save_file(_process_rng(), state_dir / "rng.safetensors")
        (state_dir / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
        write_manifest(tmp, step)
        _fsync_tree(tmp)
        if final.exists():  # a run that went back to this step (never two writers: locked)
            self._discard(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        for old in self.complete()[: -self.cfg.keep_last]:
            self._discard(old)
        return final

    def _discard(self, folder: Path) -> None:
        """Rename aside, then delete: a kill half-way leaves no half checkpoint behind."""
        trash = self.root / f".trash-{folder.name}-{os.getpid()}"
        self._remove_leftover(trash)
        os.replace(folder, trash)
        self._remove_leftover(trash)

    def load(self, path: Path, components: dict[str, Any], loaded: Any) -> int:
        """Restore the weights and each component's state from ``path``; the step."""
        loaded.load_weights(path)
        state_dir = path / STATE_DIR
        state = safe_json.read(state_dir / "state.json")  # bounded: a folder may be tampered
        for name, component in components.items():
            # A component may read its own file (the trainer of a sharded run keeps only
            # its shards of the moments); otherwise the file is read whole.
            read = getattr(component, "read_tensors", load_file)
            component.load_state_dict(read(state_dir / f"{name}.safetensors"), state[name])
        _restore_process_rng(load_file(state_dir / "rng.safetensors"))
        return int(state["step"])
