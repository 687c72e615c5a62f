"""The Unsloth backend, run for real (CI's Unsloth stage: make test-unsloth).

Without a GPU, Unsloth falls back to its CPU path: its own API (``FastLanguageModel``
loading, ``get_peft_model``) over plain transformers + peft kernels. These tests run a
short RL job through that path (the command, then a job in this process), check that
sampling and training agree, and load the checkpoints it writes in the torch backend, in
fresh processes. What they cannot cover on a CPU: Unsloth's fused GPU kernels, 4-bit
loading with bitsandbytes' CUDA kernels, and its offloaded gradient checkpointing
(``bench/gpu_smoke.py`` runs those on a GPU). Skipped where unsloth is not installed
(the main environment).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("unsloth", reason="the Unsloth stage runs in .venv-unsloth")

ART_HYDRA = str(Path(sys.executable).with_name("art-hydra"))
COMMON = [
    "backend=unsloth",
    "backend.device=auto",
    "backend.gradient_checkpointing=false",
    "model.dtype=float32",
    "trainer.per_device_train_batch_size=32",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([ART_HYDRA, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_lora_rl_job_samples_and_trains_consistently(tmp_path: Path) -> None:
    run = tmp_path / "lora"
    proc = _run(
        *COMMON,
        "model.finetune=lora",
        "model.lora.r=8",
        "trainer.max_steps=20",
        "checkpoint.every_steps=10",
        "rl.epsilon=1e-4",  # any gap between sampling and training logprobs would clip
        f"hydra.run.dir={run}",
        cwd=tmp_path,
    )
    assert "Unsloth runs its CPU fallback" in proc.stderr  # the pre-flight says so
    rows = _metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 21))
    assert max(r["clip_fraction"] for r in rows) == 0.0
    assert all(r["real_token_share"] < 1.0 for r in rows)  # one sequence per row
    ckpt = run / "checkpoints" / "step-000020"
    assert (ckpt / "adapter_model.safetensors").is_file()
    assert (ckpt / "adapter_config.json").is_file()
    # The adapters load with stock peft onto the same tiny base, in a process without unsloth.
    check = (
        "import sys, torch\n"
        "from art_hydra import compose\n"
        "from art_hydra.engine.backends.tiny import build_model, build_tokenizer\n"
        "from peft import PeftModel\n"
        "from safetensors.torch import load_file\n"
        "cfg = compose(['model.finetune=lora'])\n"
        f"base = build_model(cfg.model, build_tokenizer('=abcd'), cfg.seed)\n"
        f"model = PeftModel.from_pretrained(base, {str(ckpt)!r})\n"
        f"saved = load_file({str(ckpt / 'adapter_model.safetensors')!r})\n"
        "params = dict(model.named_parameters())\n"
        "name = next(k for k in saved if 'lora_B' in k)\n"
        "mine = name.replace('.weight', '.default.weight')\n"
        "assert torch.equal(params[mine].detach(), saved[name]), name\n"
        "assert 'unsloth' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=300)


def test_full_checkpoint_trains_on_in_the_torch_backend(tmp_path: Path) -> None:
    """The Unsloth job in this process (the command's own start-up is the test above's),
    its checkpoint trained on in a fresh process without Unsloth."""
    from art_hydra import compose, train

    run = tmp_path / "full"
    train(compose([*COMMON, "trainer.max_steps=6"]), run_dir=run)
    ckpt = run / "checkpoints" / "step-000006"
    assert (ckpt / "model.safetensors").is_file()
    again = tmp_path / "torch"
    _run(
        "backend=torch",
        f"model.name={ckpt}",
        "model.source=pretrained",
        "model.finetune=full",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=16",
        "logging.progress_bar=off",
        f"hydra.run.dir={again}",
        cwd=tmp_path,
    )
    assert len(_metrics(again)) == 2
    assert [r["step"] for r in _metrics(run)] == list(range(1, 7))
