"""Sharded training (distributed.strategy=fsdp) on 2 CPU ranks (gloo): the same weights as
DDP on the same samples (full fine-tuning, LoRA, mixed precision, SFT with accumulation),
exact resume after a stop signal and after a killed rank, ordinary checkpoints that stock
transformers loads and ``art-hydra export`` exports, and ranks that sample completions
of different lengths (agents taking different turns) without waiting on each other."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ART_HYDRA, output_of, two_ranks_by_hand, wait_for_steps
from safetensors.torch import load_file

pytestmark = pytest.mark.dist

TORCHRUN = str(Path(sys.executable).with_name("torchrun"))
HERE = Path(__file__).resolve().parent
QUIET = ["logging.progress_bar=off", "logging.tensorboard=false", "logging.plot=false"]
#: Four steps of the default task, a checkpoint after the last; constant learning rate so
#: that a run resumed with more steps follows the same schedule.
SHORT = [
    "trainer.per_device_train_batch_size=16",
    "trainer.lr_scheduler_type=constant",
    "trainer.max_steps=4",
]


def _torchrun(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    cmd = [TORCHRUN, "--standalone", "--nproc_per_node=2", "-m", "art_hydra", *QUIET, *args]
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, output_of(proc)[-3000:]
    return proc


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _samples(run: Path) -> list[object]:
    """What the ranks sampled and were rewarded, step by step (the record's time aside)."""
    lines = (run / "completions.jsonl").read_text().splitlines()
    return [json.loads(line)["samples"] for line in lines]


def _weights(run: Path, step: int, name: str = "model.safetensors") -> dict[str, torch.Tensor]:
    return load_file(run / "checkpoints" / f"step-{step:06d}" / name)


def _moments(run: Path, step: int) -> dict[str, torch.Tensor]:
    return _weights(run, step, "trainer_state/trainer.safetensors")


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys() and a
    assert all(a[k].shape == b[k].shape and a[k].dtype == b[k].dtype for k in a)
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


#: Float32 compute: the strategies differ by the order of a few float sums (the gradient
#: norm over shards), so the weights agree to float32's rounding after every step.
FLOAT32 = 1e-6
#: Half compute (bfloat16, float16) on float32 masters: after the first step (equal to
#: float32's rounding), a weight one float32 ulp apart can round to another half value
#: in the next forward, so later steps agree to bfloat16's resolution (2**-8 relative).
HALF = 2.0**-8


@pytest.mark.parametrize(
    ("extra", "weights", "later"),
    [
        ([], "model.safetensors", FLOAT32),
        (["model.finetune=lora"], "adapter_model.safetensors", FLOAT32),
        (["model.dtype=bfloat16"], "model.safetensors", HALF),
        (["model.dtype=float16"], "model.safetensors", HALF),
        (
            ["experiment=tiny_sft_reverse", "trainer.gradient_accumulation_steps=2"],
            "model.safetensors",
            FLOAT32,
        ),
    ],
    ids=["full", "lora", "bfloat16", "float16", "sft-accumulation"],
)
def test_fsdp_trains_the_weights_ddp_trains(
    tmp_path: Path, extra: list[str], weights: str, later: float
) -> None:
    """The same run under both strategies: the same samples (the sampler's whole copy
    holds the policy's weights), the same losses, and weights and AdamW moments equal
    within float tolerance after every step (only the gradient reduction is split
    differently)."""
    for strategy in ("ddp", "fsdp"):
        _torchrun(
            *SHORT,
            *extra,
            "checkpoint.every_steps=1",
            "checkpoint.keep_last=4",
            f"distributed.strategy={strategy}",
            f"hydra.run.dir={strategy}",
            cwd=tmp_path,
        )
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    if "experiment=tiny_sft_reverse" not in extra:
        assert _samples(ddp) == _samples(fsdp)
    losses = [(a["loss"], b["loss"]) for a, b in zip(_metrics(ddp), _metrics(fsdp), strict=True)]
    assert len(losses) == 4
    for step in range(1, 5):
        tolerance = FLOAT32 if step == 1 else later
        a, b = _weights(ddp, step, weights), _weights(fsdp, step, weights)
        scale = max(1.0, max(v.abs().max().item() for v in a.values()))
        assert _gap(a, b) <= tolerance * scale, (step, _gap(a, b))
        assert _gap(_moments(ddp, step), _moments(fsdp, step)) <= tolerance, step
        loss_a, loss_b = losses[step - 1]
        assert abs(loss_a - loss_b) <= max(tolerance, 1e-5) * max(1.0, abs(loss_a)), step
    assert "sharding: FSDP2 over 2 ranks" in (fsdp / "art_hydra.log").read_text()


def test_an_fsdp_run_resumes_exactly_and_its_checkpoint_is_ordinary(tmp_path: Path) -> None:
    """Three steps, then a resume to six, ends bit-identical to six steps at once; the
    checkpoint is one model.safetensors that transformers loads alone, its optimizer
    moments whole, and ``art-hydra export`` exports it."""
    base = [*SHORT, "checkpoint.every_steps=3"]
    common = [*base, "distributed.strategy=fsdp"]
    _torchrun(*common, "trainer.max_steps=6", "hydra.run.dir=whole", cwd=tmp_path)
    _torchrun(*common, "trainer.max_steps=3", "hydra.run.dir=parts", cwd=tmp_path)
    _torchrun(*common, "trainer.max_steps=6", "resume=true", "hydra.run.dir=parts", cwd=tmp_path)
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert _gap(_weights(whole, 6), _weights(parts, 6)) == 0.0
    assert _gap(_moments(whole, 6), _moments(parts, 6)) == 0.0
    assert [r["loss"] for r in _metrics(whole)] == [r["loss"] for r in _metrics(parts)]
    # A checkpoint does not depend on the strategy that wrote it: three steps under DDP,
    # resumed under FSDP, end where six FSDP steps end (to float32's rounding).
    ddp_first = [*base, "distributed.strategy=ddp", "hydra.run.dir=switched"]
    _torchrun(*ddp_first, "trainer.max_steps=3", cwd=tmp_path)
    switched = [*common, "trainer.max_steps=6", "resume=true", "hydra.run.dir=switched"]
    _torchrun(*switched, cwd=tmp_path)
    assert _gap(_weights(whole, 6), _weights(tmp_path / "switched", 6)) <= FLOAT32
    folder = parts / "checkpoints" / "step-000006"
    assert sorted(p.name for p in folder.glob("*.safetensors")) == ["model.safetensors"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder)
    state = model.state_dict()
    for name, value in _weights(parts, 6).items():
        assert torch.equal(state[name], value), name
    moments = _moments(parts, 6)
    assert moments["0.exp_avg"].shape == model.get_input_embeddings().weight.shape
    export = subprocess.run(
        [ART_HYDRA, "export", str(parts), str(tmp_path / "exported")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert export.returncode == 0, output_of(export)
    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "exported")
    assert all(torch.equal(exported.state_dict()[k], v) for k, v in state.items())


def _script_on_two_ranks(name: str, tmp_path: Path) -> list[dict]:
    """Run this folder's script ``name`` on two ranks under torchrun; what each rank wrote
    to ``tmp_path/rank{N}.json``."""
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc_per_node=2", str(HERE / name), str(tmp_path)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, output_of(proc)[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _finish(procs: list[subprocess.Popen]) -> list[str]:
    return [p.communicate(timeout=180)[1] for p in procs]


@pytest.mark.parametrize("how", ["SIGTERM", "kill -9"])
def test_a_stopped_or_killed_fsdp_run_resumes_to_the_uninterrupted_weights(
    tmp_path: Path, how: str
) -> None:
    """A stop signal (both ranks stop at the same step, with a checkpoint), or a rank
    killed outright (the other stops naming it; the last checkpoint is intact): resumed
    with the same command, the run ends with the weights of a run never interrupted."""
    common = [
        *SHORT,
        "trainer.max_steps=10",
        "distributed.strategy=fsdp",
        "distributed.timeout_s=30",
        "checkpoint.every_steps=2",
        # Ranks started by hand and by torchrun (which sets OMP_NUM_THREADS=1) sum floats
        # over the same threads only when the count is given.
        "backend.cpu_threads=1",
    ]
    _torchrun(*common, "hydra.run.dir=whole", cwd=tmp_path)
    procs = two_ranks_by_hand(*QUIET, *common, "hydra.run.dir=run", cwd=tmp_path)
    wait_for_steps(tmp_path / "run", 3, procs[0])
    if how == "SIGTERM":
        procs[0].send_signal(signal.SIGTERM)
        errs = _finish(procs)
        assert [p.returncode for p in procs] == [143, 143], errs
    else:
        victim = json.loads((tmp_path / "run" / ".ranks" / "rank1.json").read_text())["pid"]
        os.kill(victim, signal.SIGKILL)
        errs = _finish(procs)
        assert procs[0].returncode == 1 and "died without a word" in errs[0], errs[0]
    assert "Traceback" not in errs[0]
    _torchrun(*common, "resume=true", "hydra.run.dir=run", cwd=tmp_path)
    assert _gap(_weights(tmp_path / "whole", 10), _weights(tmp_path / "run", 10)) == 0.0


def test_ranks_sampling_different_lengths_and_turns_do_not_wait_on_each_other(
    tmp_path: Path,
) -> None:
    """Each rank samples from its whole copy, so ranks whose completions stop at
    different lengths (a script: rank 0 one token, rank 1 forty) and agents whose
    trajectories take different numbers of turns (the tool task) finish their steps."""
    lengths = _script_on_two_ranks("sharded_sampling.py", tmp_path)
    assert lengths[0]["longest"] == 1 and lengths[1]["longest"] == 40, lengths
    _torchrun(
        "experiment=tool_use",
        "distributed.strategy=fsdp",
        "rl.sft_warm_start_steps=200",
        "rl.beta=0.05",  # the KL reference re-anchored to the warm start: a whole copy
        "trainer.per_device_train_batch_size=16",
        "trainer.max_steps=3",
        "eval.fraction=0.1",
        "eval.every_steps=3",
        "hydra.run.dir=agent",
        cwd=tmp_path,
    )
    rows = _metrics(tmp_path / "agent")
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert any(r["tool_calls_mean"] > 0 for r in rows), rows
    assert "eval/reward" in rows[-1]


def test_a_float16_overflow_on_one_rank_skips_the_step_on_every_rank(tmp_path: Path) -> None:
    """Loss scaling under sharding: each rank's scaler sees only its shard of the
    gradients; an infinite gradient in rank 1's shard alone makes both ranks skip the
    step (no rank's weights move) and halve their scale alike."""
    found = _script_on_two_ranks("sharded_overflow.py", tmp_path)
    assert found[0] == found[1], found
    assert found[0]["skipped"] and not found[0]["moved"], found
    assert found[0]["scale"][1] == found[0]["scale"][0] / 2, found


def test_a_model_whose_head_is_tied_to_its_embeddings_shards_and_saves_the_tie(
    tmp_path: Path,
) -> None:
    """A Qwen2-family folder with tied embeddings (as Qwen2.5 0.5B-3B and Llama 3.2
    ship): the whole copies (sampler, KL reference) keep the tie, the run trains as under
    DDP, and the checkpoint holds the embeddings once, as save_pretrained writes a tied
    model, and loads tied."""
    from model_folders import qwen_tokenizer, random_model

    folder = tmp_path / "tied"
    random_model(folder, "qwen2", qwen_tokenizer(folder), tie_word_embeddings=True)
    for strategy in ("ddp", "fsdp"):
        _torchrun(
            *SHORT,
            "trainer.max_steps=2",
            "model.source=pretrained",
            f"model.name={folder}",
            "rl.max_prompt_length=24",
            "rl.beta=0.1",
            f"distributed.strategy={strategy}",
            f"hydra.run.dir={strategy}",
            cwd=tmp_path,
        )
    ddp, fsdp = _weights(tmp_path / "ddp", 2), _weights(tmp_path / "fsdp", 2)
    assert "lm_head.weight" not in fsdp
    assert _gap(ddp, fsdp) <= FLOAT32
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "checkpoints" / "step-000002")
    assert model.lm_head.weight is model.get_input_embeddings().weight
