"""Checkpoints: standard Hugging Face / PEFT folders plus the trainer's state.

``checkpoints/step-000050/`` holds ``adapter_model.safetensors`` + ``adapter_config.json``
(LoRA; loadable with ``peft.PeftModel.from_pretrained``) or ``model.safetensors`` +
``config.json`` (full fine-tuning), the tokenizer, and ``trainer_state/`` with the
optimizer moments and RNG states (safetensors) and the step, schedule and data position
(JSON). Nothing is pickled. A checkpoint is written into a temporary folder and renamed
into place, so a folder named ``step-*`` is always complete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from art_hydra.run_folder import checkpoint_folders

PREFIX = "step-"
STATE_DIR = "trainer_state"


def optimizer_to_safetensors(optimizer: Any) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Split an optimizer state dict into tensors (safetensors) and plain values (JSON)."""
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    plain: dict[str, Any] = {"param_groups": state["param_groups"], "state": {}}
    for index, values in state["state"].items():
        plain["state"][str(index)] = {}
        for key, value in values.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{key}"] = value.detach().contiguous().cpu()
            else:
                plain["state"][str(index)][key] = value
    return tensors, plain


def optimizer_from_safetensors(
    optimizer: Any, tensors: dict[str, torch.Tensor], plain: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {int(i): dict(v) for i, v in plain["state"].items()}
    for name, tensor in tensors.items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = tensor
    optimizer.load_state_dict({"state": state, "param_groups": plain["param_groups"]})


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


class Checkpointer:
    """Writes, lists, prunes and loads the checkpoints of one run (reads ``cfg.checkpoint``)."""

    def __init__(self, run_dir: Path, checkpoint_cfg: Any) -> None:
        self.cfg = checkpoint_cfg
        self.root = Path(run_dir) / checkpoint_cfg.dir

    def due(self, step: int, max_steps: int) -> bool:
        every = self.cfg.every_steps
        return step == max_steps or (every > 0 and step % every == 0)

    def complete(self) -> list[Path]:
        """Checkpoints that were renamed into place (only whole ones ever are), oldest
        first by step number."""
        return checkpoint_folders(self.root)

    def latest(self) -> Path | None:
        found = self.complete()
        return found[-1] if found else None

    def save(self, step: int, trainer: Any, producer: Any, extra: dict[str, Any]) -> Path:
        """Write step ``step`` atomically and prune old checkpoints."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"{PREFIX}{step:06d}"
        tmp = self.root / f".tmp-{PREFIX}{step:06d}-{os.getpid()}"
        for stale in self.root.glob(f".tmp-{PREFIX}*"):  # left by a crashed writer
            shutil.rmtree(stale, ignore_errors=True)
        loaded = trainer.loaded
        if loaded.is_peft:
            from art_hydra.backends.adapters import save_adapters

            save_adapters(loaded.model, tmp)
        else:
            loaded.model.save_pretrained(tmp, safe_serialization=True)
        loaded.tokenizer.save_pretrained(tmp)
        state_dir = tmp / STATE_DIR
        state_dir.mkdir()
        tensors, plain = optimizer_to_safetensors(trainer.optimizer)
        save_file(tensors, state_dir / "optimizer.safetensors")
        rng = {"torch_cpu": torch.get_rng_state()}
        if torch.cuda.is_available():
            for index, state in enumerate(torch.cuda.get_rng_state_all()):
                rng[f"torch_cuda_{index}"] = state
        if producer.generator is not None:
            rng["sampler"] = producer.generator.get_state().cpu()
        save_file(rng, state_dir / "rng.safetensors")
        # Inside the temporary folder: the rename below makes the whole checkpoint atomic.
        state = {
            "step": step,
            "optimizer": plain,
            "scheduler": trainer.scheduler.state_dict(),
            "scaler": trainer.scaler.state_dict() if trainer.scaler is not None else None,
            "producer": producer.state_dict(),
            **extra,
        }
        (state_dir / "state.json").write_text(json.dumps(state, indent=1, sort_keys=True))
        _fsync_tree(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(self.root)
        for old in self.complete()[: -self.cfg.keep_last]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    def load(self, path: Path, trainer: Any, producer: Any) -> dict[str, Any]:
        """Restore weights, optimizer, schedule, RNG and data position from ``path``."""
        model = trainer.loaded.model
        device = trainer.loaded.device
        if trainer.loaded.is_peft:
            from art_hydra.backends.adapters import load_adapters

            weights = load_file(path / "adapter_model.safetensors", device=str(device))
            unexpected = load_adapters(model, weights)
            if unexpected:
                raise RuntimeError(
                    f"checkpoint {path} does not match the adapters: unexpected {unexpected[:5]}"
                )
        else:
            weights = {}
            for shard in sorted(path.glob("*.safetensors")):
                weights.update(load_file(shard, device=str(device)))
            missing, unexpected = model.load_state_dict(weights, strict=False)
            if unexpected or [m for m in missing if not m.endswith("lm_head.weight")]:
                raise RuntimeError(
                    f"checkpoint {path} does not match the model: missing {missing[:5]}, "
                    f"unexpected {unexpected[:5]}"
                )
        state_dir = path / STATE_DIR
        state = json.loads((state_dir / "state.json").read_text())
        optimizer_from_safetensors(
            trainer.optimizer, load_file(state_dir / "optimizer.safetensors"), state["optimizer"]
        )
        trainer.scheduler.load_state_dict(state["scheduler"])
        if trainer.scaler is not None and state.get("scaler"):
            trainer.scaler.load_state_dict(state["scaler"])
        trainer.step = state["step"]
        rng = load_file(state_dir / "rng.safetensors")
        torch.set_rng_state(rng["torch_cpu"])
        cuda = [rng[k] for k in sorted(rng) if k.startswith("torch_cuda_")]
        if cuda and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(cuda)
        if producer.generator is not None and "sampler" in rng:
            producer.generator.set_state(rng["sampler"].to(producer.generator.device))
        producer.load_state_dict(state["producer"])
        return state
