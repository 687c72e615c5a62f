"""What each rank needs, checked by the world pre-flight (art_hydra/preflight/rank_memory.py):
the arithmetic of :func:`per_rank` in exact bytes, the tiny model's size from its shape,
and each verdict both ways with the machine faked (the installed torch's version, a GPU
visible or not, the device's memory), through the same path the CLI takes (composition,
then :func:`add_world_problems`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.problems import Problem, Severity
from art_hydra.preflight import (
    add_world_problems,
    cuda_present,
    rank_memory,
    registered_world_checks,
)
from art_hydra.preflight.rank_memory import RankMemory, per_rank
from tests.conftest import output_of

pytestmark = pytest.mark.fast

TWO = ("distributed.world_size=2", "backend.device=cpu", "distributed.backend=gloo")
FSDP = (*TWO, "distributed.strategy=fsdp")
#: The tiny model's parameters (model.tiny defaults: hidden 64, 2 layers, MLP 256; a
#: 99-token vocabulary: 4 specials and 95 printable characters; an untied head).
TINY = 99 * 64 * 2 + 2 * (4 * 64 * 64 + 3 * 64 * 256 + 2 * 64) + 64
#: Those in linear layers (what a frozen copy stores in the half type): all but the
#: embedding matrix and the norms.
TINY_LINEAR = TINY - 99 * 64 - (2 * 2 * 64 + 64)


@pytest.fixture(scope="module")
def loader() -> Any:
    return make_loader()


def _report(loader: Any, tmp: Path, *overrides: str) -> list[Problem]:
    result = compose_and_check(
        loader, "config", [*overrides, f"hydra.run.dir={tmp}/run"], RunMode.RUN
    )
    add_world_problems(result)
    return [p for p in result.problems if p.key != "distributed.world_size"]


# ---- the arithmetic ---------------------------------------------------------------------


def test_ddp_keeps_everything_whole_on_every_rank() -> None:
    found = per_rank(1000, 1000, 4, 4, "ddp", 4, copies=1, copy_bytes=2000)
    assert found == RankMemory(4000, 4000, 8000, 2000, 0, 18000)
    assert found.on_device == 18000


def test_fsdp_shards_weights_gradients_and_moments_but_not_the_copies() -> None:
    found = per_rank(1000, 1000, 4, 4, "fsdp", 4, copies=2, copy_bytes=2000)
    assert found == RankMemory(1000, 1000, 2000, 4000, 0, 8000)
    # A LoRA model: 1000 frozen parameters in bfloat16, 100 adapters in float32, 3 ranks
    # (each holds the rounded-up share of each count).
    lora = per_rank(1100, 100, 2, 4, "fsdp", 3)
    assert lora == RankMemory(334 * 2 + 34 * 4, 34 * 4, 2 * 34 * 4, 0, 0, 334 * 2 + 4 * 34 * 4)


def test_offload_moves_the_shards_off_the_device_and_one_rank_shards_nothing() -> None:
    found = per_rank(1000, 1000, 4, 4, "fsdp", 2, copies=1, copy_bytes=2000, offload=True)
    assert (found.offloaded, found.on_device, found.total) == (8000, 2000, 10000)
    assert per_rank(1000, 1000, 4, 4, "fsdp", 1) == per_rank(1000, 1000, 4, 4, "ddp", 1)
    # The defaults: full fine-tuning in float32 under DDP on one rank (16 bytes a parameter).
    assert per_rank(1000).total == 16000 and per_rank(1000, strategy="fsdp", ranks=8).total == 2000
    with pytest.raises(ValueError, match="ddp or fsdp"):
        per_rank(1, 1, 4, 4, "zero3", 2)


def test_the_tiny_models_size_and_state_follow_its_shape(loader: Any) -> None:
    cfg = compose_and_check(loader, "config", ["dry_run=true"], RunMode.RUN).resolved
    size = rank_memory.policy_size(cfg.model)
    assert (size.parameters, size.linear) == (TINY, TINY_LINEAR)
    # model=tiny trains in float32, full fine-tuning: 4 + 4 + 8 bytes a parameter.
    ddp = rank_memory.estimate(cfg, size, cfg.distributed.strategy, 2)
    assert ddp == RankMemory(4 * TINY, 4 * TINY, 8 * TINY, 0, 0, 16 * TINY)
    # Sharded RL samples from a whole float32 copy on every rank.
    fsdp = rank_memory.estimate(cfg, size, rank_memory.DistStrategy.fsdp, 2)
    half = TINY // 2
    assert fsdp == RankMemory(4 * half, 4 * half, 8 * half, 4 * TINY, 0, 16 * half + 4 * TINY)


def test_bfloat16_lora_and_the_reference_copy(loader: Any) -> None:
    cfg = compose_and_check(
        loader, "config", ["model.dtype=bfloat16", "rl.beta=0.1"], RunMode.RUN
    ).resolved
    size = rank_memory.policy_size(cfg.model)
    full = rank_memory.estimate(cfg, size, cfg.distributed.strategy, 1)
    copy = 2 * TINY_LINEAR + 4 * (TINY - TINY_LINEAR)  # frozen_copy: linear weights halved
    assert (full.params, full.copies) == (4 * TINY, copy)
    lora = rank_memory.estimate(cfg, size, cfg.distributed.strategy, 1, finetune=lora_method())
    trained = size.adapters + size.saved  # the saved head is a trained copy beside the base
    assert size.saved == 99 * 64 and size.adapters == 2 * 16 * (4 * 128 + 3 * 320)
    assert lora == RankMemory(
        2 * TINY + 4 * trained, 4 * trained, 8 * trained, 0, 0, 2 * TINY + 16 * trained
    )


def lora_method() -> Any:
    return rank_memory.FinetuneMethod.lora


# ---- the verdicts -----------------------------------------------------------------------


def _memory(monkeypatch: pytest.MonkeyPatch, size: int) -> None:
    monkeypatch.setattr(rank_memory, "device_memory", lambda device: size)


def test_state_beyond_the_shared_memory_is_refused_with_fsdp_as_the_fix(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two CPU ranks: DDP's 2 x 16 bytes a parameter exceed it; sharded, 2 x (8 + 4) do not.
    _memory(monkeypatch, 28 * TINY)
    (problem,) = _report(loader, tmp_path, *TWO, "dry_run=true")
    assert (problem.key, problem.value, problem.severity) == (
        "distributed.strategy",
        "ddp",
        Severity.error,
    )
    assert "the 2 ranks on this machine share" in problem.reason
    assert problem.fix.overrides() == ["distributed.strategy=fsdp"]
    assert _report(loader, tmp_path, *FSDP, "dry_run=true") == []
    _memory(monkeypatch, 32 * TINY)
    assert _report(loader, tmp_path, *TWO, "dry_run=true") == []


def test_one_process_too_large_is_told_lora(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _memory(monkeypatch, 10 * TINY)
    (problem,) = _report(loader, tmp_path, "dry_run=true")
    assert (problem.key, problem.severity) == ("model.finetune", Severity.error)
    assert "the one process holds" in problem.reason
    assert problem.fix.overrides() == ["model.finetune=lora"]
    _memory(monkeypatch, 16 * TINY)
    assert _report(loader, tmp_path, "dry_run=true") == []


def test_a_gpu_too_small_for_the_sharded_state_is_told_how_many_ranks_fit(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_memory, "training_device", lambda cfg: "cuda")
    # Sharded over 2 ranks: 16 bytes a parameter halved + a whole float32 copy (4 bytes)
    # = 12 bytes a parameter per rank; over 3 ranks about 9.3.
    _memory(monkeypatch, 11 * TINY)
    gpu = ("distributed.world_size=2", "distributed.strategy=fsdp", "model.finetune=full")
    (problem,) = [p for p in _report(loader, tmp_path, *gpu) if p.key == "distributed.strategy"]
    assert "a GPU here has" in problem.reason
    notes = []
    remedy = problem.fix
    while remedy is not None:
        notes.append(" ".join([*remedy.overrides(), remedy.note]).strip())
        remedy = remedy.alt
    assert problem.fix.overrides() == ["distributed.fsdp.cpu_offload=true"]
    assert notes[1:] == [
        "model.finetune=lora about 1.44 MiB per rank",
        "launch 3 ranks or more with distributed.strategy=fsdp (about 1.28 MiB per rank)",
    ]


def test_an_old_torch_is_refused_only_where_it_would_shard(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(rank_memory, "installed_torch", lambda: "2.5.1")
    (problem,) = [p for p in _report(loader, tmp_path, *FSDP) if p.key == "distributed.strategy"]
    assert problem.severity == Severity.error and "torch 2.5.1 is installed" in problem.reason
    assert problem.fix.note == "pip install 'torch>=2.6,<2.15'"
    assert problem.fix.alt.overrides() == ["distributed.strategy=ddp"]
    assert _report(loader, tmp_path, *TWO) == []
    monkeypatch.setattr(rank_memory, "installed_torch", lambda: "2.6.0+cu124")
    assert _report(loader, tmp_path, *FSDP) == []


def test_offload_needs_a_visible_gpu_under_auto(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    line = (
        "distributed.world_size=2",
        "distributed.strategy=fsdp",
        "distributed.fsdp.cpu_offload=true",
    )
    monkeypatch.setattr(rank_memory, "device_memory", lambda device: None)
    monkeypatch.setattr(rank_memory, "cuda_present", lambda: False)
    found = [p for p in _report(loader, tmp_path, *line) if p.key.startswith("distributed.fsdp")]
    assert [(p.key, p.severity) for p in found] == [
        ("distributed.fsdp.cpu_offload", Severity.error)
    ]
    assert found[0].fix.overrides() == ["distributed.fsdp.cpu_offload=false"]
    monkeypatch.setattr(rank_memory, "cuda_present", lambda: True)
    found = [p for p in _report(loader, tmp_path, *line) if p.key.startswith("distributed.fsdp")]
    assert found == []


def test_the_check_is_registered_and_imports_no_torch() -> None:
    check = registered_world_checks()["ranks"]
    assert check.devices and "distributed" in check.reads
    code = "import sys, art_hydra.preflight.rank_memory; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "False", out.stderr


@pytest.mark.skipif(cuda_present(), reason="a visible GPU has something to offload from")
def test_the_cli_dry_run_reports_offload_without_a_gpu(cli) -> None:
    line = ("distributed.world_size=2", "distributed.strategy=fsdp")
    refused = cli(*line, "distributed.fsdp.cpu_offload=true", "dry_run=true")
    out = output_of(refused)
    assert refused.returncode == 1 and "distributed.fsdp.cpu_offload = True" in out, out
    assert cli(*line, "dry_run=true").returncode == 0


def test_a_sharded_run_whose_model_does_not_load_whole_is_refused(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank loads the model whole before sharding it. On 16 GPUs a bfloat16 run on
    float32 masters holds about 3 bytes a parameter per rank once sharded (16/16 + the
    sampler's copy), but loads 4 bytes a parameter first: a GPU of 3.5 bytes a parameter
    holds the state, not the load. LoRA (its base loaded in bfloat16) fits."""
    monkeypatch.setattr(rank_memory, "training_device", lambda cfg: "cuda")
    _memory(monkeypatch, int(3.5 * TINY))
    run = ("distributed.world_size=16", "distributed.strategy=fsdp", "model.dtype=bfloat16")
    found = [p for p in _report(loader, tmp_path, *run) if p.key == "distributed.strategy"]
    (problem,) = found
    assert problem.severity == Severity.error
    assert "loads the whole model" in problem.reason and "the load does not" in problem.reason
    assert problem.fix.overrides() == ["model.finetune=lora"]
    _memory(monkeypatch, int(4.1 * TINY))
    assert [p for p in _report(loader, tmp_path, *run) if p.key == "distributed.strategy"] == []


def test_lora_is_offered_only_where_its_base_loads_whole(
    loader: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SFT on 16 GPUs, sharded, no sampler copy: LoRA's sharded state (a bfloat16 base
    over 16 ranks) would fit a GPU of half a byte a parameter, but every rank loads its
    base whole first (2 bytes a parameter): no fix offers LoRA there."""
    monkeypatch.setattr(rank_memory, "training_device", lambda cfg: "cuda")
    _memory(monkeypatch, int(0.5 * TINY))
    run = (
        "experiment=tiny_sft_reverse",
        "distributed.world_size=16",
        "distributed.strategy=fsdp",
        "model.dtype=bfloat16",
    )
    (problem,) = [p for p in _report(loader, tmp_path, *run) if p.key == "distributed.strategy"]
    remedies = []
    remedy = problem.fix
    while remedy is not None:
        remedies += remedy.overrides()
        remedy = remedy.alt
    assert "model.finetune=lora" not in remedies, remedies
