"""rollout.engine=vllm, run for real on vLLM's CPU build (CI's vLLM stage: make test-vllm).

The engine holds its own copy of the weights, so every check here is about that copy
following the policy: the logprob vLLM reports for each sampled token must equal the
trainer's logprob of it (``sampling_mismatch_max``, float32 on both sides) at the first
step, after optimizer steps that changed the weights, with LoRA synced as an adapter or
merged into the base weights, while evaluating, and after a resume (the engine starts
from the base folder, so only a sync gives it the resumed weights). One test drives the
engine in this process to show the check catches a stale engine. What a CPU cannot
cover: CUDA graphs, sleep mode and GPU memory sharing (``bench/gpu_smoke.py``).
Skipped where vllm is not installed (the main environment).

Every engine start costs seconds, and a fresh process tens of seconds (torch,
transformers and vLLM imported again), so the full fine-tuning checks share one run
(:func:`full_run`): the command itself, as a user runs it, then resumed in this
process; the other jobs run in this process too (``art_hydra.train``, the generate
command's ``main``), what they prove being the engine's, not the command line's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM stage runs in .venv-vllm")

ART_HYDRA = str(Path(sys.executable).with_name("art-hydra"))
#: Float32 kernels on both sides differ by rounding alone (~5e-7 seen); a stale engine,
#: one optimizer step behind, is off by orders of magnitude more.
MISMATCH = 1e-4


def common(model: Path) -> list[str]:
    """Overrides of every run: the tiny llama folder, float32, vLLM without compiling
    (it starts in seconds instead of half a minute on a CPU) and with a KV cache of the
    size these runs use (64 MiB holds over 100,000 of its tokens; by default it reserves
    a share of the machine's memory, gigabytes filled at every start), a learning rate at
    which a few steps move the weights, and none of the outputs these tests do not read."""
    return [
        "rollout.engine=vllm",
        "rollout.vllm.enforce_eager=true",
        "rollout.vllm.kv_cache_gib=0.0625",
        "model=pretrained",
        f"model.name={model}",
        "model.dtype=float32",
        "trainer.learning_rate=3e-3",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
    ]


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([ART_HYDRA, *args], cwd=cwd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def _train(run: Path, *overrides: str) -> None:
    """A job in this process, as ``art-hydra OVERRIDES hydra.run.dir=RUN`` runs it."""
    from art_hydra import compose, train

    train(compose(list(overrides)), run_dir=run)


def _metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _train_rows(run: Path) -> list[dict]:
    return [row for row in _metrics(run) if "sampling_mismatch_max" in row]


def assert_engine_follows_the_policy(rows: list[dict]) -> None:
    """Every step's rollouts carry the trainer's logprobs, including steps sampled after
    an optimizer step that changed the weights (a nonzero gradient: Adam moves every
    weight it reaches by about the learning rate)."""
    assert rows, "no training steps logged"
    for row in rows:
        assert row["sampling_mismatch_max"] < MISMATCH, row
    # Some step after the first that moved the weights was checked above: a stale engine
    # (no sync) is off by 0.3 to 1.2 there on this model.
    moved = [i for i, row in enumerate(rows) if row["grad_norm"] > 0]
    assert moved and moved[0] < len(rows) - 1, [r["grad_norm"] for r in rows]


@dataclass(frozen=True)
class FullRun:
    """One full fine-tuning run: 4 steps with evaluation, then resumed to 6."""

    folder: Path  # the run folder
    output: str  # the command's stdout and stderr (its first 4 steps)
    first: list[dict]  # every metrics row the command wrote (steps 1-4, evaluations)
    rows: list[dict]  # the training rows after the resume (steps 1-6)


@pytest.fixture(scope="module")
def full_run(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> FullRun:
    """``art-hydra`` itself (a fresh process: the engine's environment set before vLLM is
    first imported), 4 steps evaluated every 2 through the engine; then the same run
    resumed in this process to step 6, its engine started from the base folder."""
    where = tmp_path_factory.mktemp("full")
    run = where / "run"
    args = [*common(tiny_llama), "model.finetune=full", "eval.fraction=0.2", "eval.every_steps=2"]
    proc = _run(*args, "trainer.max_steps=4", f"hydra.run.dir={run}", cwd=where)
    first = _metrics(run)
    _train(run, *args, "trainer.max_steps=6", "resume=true")
    return FullRun(run, proc.stdout + proc.stderr, first, _train_rows(run))


def test_full_fine_tuning_keeps_the_engine_on_the_policy(full_run: FullRun) -> None:
    assert "rollouts: vLLM" in full_run.output
    first = [row for row in full_run.first if "sampling_mismatch_max" in row]
    assert [r["step"] for r in first] == [1, 2, 3, 4]
    assert_engine_follows_the_policy(first)  # in one process: each step's sync
    # The weights changed more than once, each change synced before the next rollouts.
    assert sum(r["grad_norm"] > 0 for r in first) >= 2
    assert any(r["loss"] != 0 for r in first)
    assert_engine_follows_the_policy(full_run.rows)


def test_evaluation_samples_through_the_engine(full_run: FullRun) -> None:
    evals = [row for row in full_run.first if "eval/reward" in row]
    assert len(evals) >= 2, full_run.first  # steps 2 and 4, between optimizer steps
    assert all(0.0 <= row["eval/reward"] <= 1.0 for row in evals)
    assert all(r["sampling_mismatch_max"] < MISMATCH for r in full_run.rows)


def test_a_resumed_run_syncs_the_engine_to_the_resumed_weights(full_run: FullRun) -> None:
    """vLLM starts from model.name, the base weights; the resumed policy differs from
    them (its first steps had gradients), so only a sync keeps the mismatch small."""
    first = [row for row in full_run.first if "sampling_mismatch_max" in row]
    assert any(r["grad_norm"] > 0 for r in first), first  # step 4's weights are not the base's
    rows = full_run.rows
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    # Step 5's rollouts are the resumed process's first, sampled before any optimizer step.
    assert all(r["sampling_mismatch_max"] < MISMATCH for r in rows[4:]), rows[4:]


def _generate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """``art-hydra generate ARGV`` in this process: its status, stdout and stderr."""
    from art_hydra.commands import generate

    capsys.readouterr()
    status = generate.main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_generate_on_the_engine_matches_the_torch_side(
    full_run: FullRun, capsys: pytest.CaptureFixture[str]
) -> None:
    """``art-hydra generate --engine vllm`` (the run's model exported to a temporary
    folder, then vLLM on it) decodes greedily what transformers' generate does, and
    ``rollout.engine=vllm`` spelled as a run spells it does the same."""
    prompts = ["-p", "abc=", "-p", "dcb="]
    status, out, err = _generate(capsys, str(full_run.folder), *prompts, "--json")
    assert status == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    for spelling in (["--engine", "vllm"], ["rollout.engine=vllm"]):
        status, out, err = _generate(capsys, str(full_run.folder), *prompts, "--json", *spelling)
        assert status == 0, err
        assert [json.loads(line) for line in out.splitlines()] == rows
    assert len(rows) == 2 and all(row["completion"] is not None for row in rows)


def test_generate_refuses_what_the_engine_cannot_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run of the built-in tiny model (16-wide heads) and a temperature vLLM would not
    sample at are refused in one line, before anything is exported or started."""
    _train(tmp_path / "tiny", "trainer.max_steps=1", "logging.progress_bar=off")
    status, out, err = _generate(capsys, str(tmp_path / "tiny"), "-p", "abc=", "--engine", "vllm")
    assert status == 2 and "Traceback" not in err, err
    assert "16-wide heads" in err and out == ""


@pytest.mark.parametrize(
    "finetune",
    [
        ["model.finetune=full"],
        ["model.finetune=lora", "rollout.vllm.lora_sync=adapter"],
        [
            "model.finetune=lora",
            "rollout.vllm.lora_sync=merged",
            "model.lora.modules_to_save=[lm_head]",
        ],
    ],
    ids=["full", "lora-adapter", "lora-merged"],
)
def test_a_stale_engine_is_caught_and_a_sync_fixes_it(
    tiny_llama: Path, finetune: list[str]
) -> None:
    """In this process: vLLM's logprobs against a torch forward of the policy. After the
    weights training changes move (LoRA: the adapters, B included, and the fully trained
    head), the engine's logprobs disagree until ``sync_weights``: the gap the training
    runs assert is small is one a stale engine would show."""
    import torch

    from art_hydra import compose
    from art_hydra.engine.recipe import build_run_parts
    from art_hydra.engine.rl.sampling import SamplingSettings, logprob_logits, suppressed_ids
    from art_hydra.engine.rollout.base import Request

    cfg = compose([*common(tiny_llama), *finetune, "trainer.max_steps=1"])
    parts = build_run_parts(cfg)
    engine = parts.engine
    try:
        loaded = engine.loaded
        tokenizer = loaded.tokenizer
        settings = SamplingSettings(suppress_ids=tuple(suppressed_ids(tokenizer)))
        prompts = ["abc=", "dcba=", "ab=", "bad="]
        requests = [
            Request(tuple(tokenizer(p).input_ids), 8, (tokenizer.eos_token_id,)) for p in prompts
        ]

        def gap() -> float:
            found = engine.generate(requests, settings, torch.Generator().manual_seed(0))
            worst = 0.0
            for request, completion in zip(requests, found, strict=True):
                ids = torch.tensor([[*request.prompt_ids, *completion.token_ids]])
                with torch.no_grad():
                    logits = loaded.model(input_ids=ids).logits[0]
                start = len(request.prompt_ids)
                logprobs = torch.log_softmax(logprob_logits(logits, settings), dim=-1)
                mine = logprobs[start - 1 : -1].gather(
                    1, torch.tensor(completion.token_ids)[:, None]
                )[:, 0]
                theirs = torch.tensor(completion.logprobs)
                worst = max(worst, float((mine - theirs).abs().max()))
            return worst

        assert gap() < MISMATCH
        with torch.no_grad():
            generator = torch.Generator().manual_seed(1)
            trained = [p for p in loaded.model.parameters() if p.requires_grad]
            for param in trained:
                param.add_(0.05 * torch.randn(param.shape, generator=generator))
        stale = gap()
        assert stale > 100 * MISMATCH, stale
        engine.sync_weights()
        assert gap() < MISMATCH
    finally:
        engine.close()


def _adapter_b_moved(run: Path) -> bool:
    """Whether the last checkpoint's LoRA B matrices (zero at the start) have moved."""
    from safetensors.torch import load_file

    (ckpt,) = sorted((run / "checkpoints").iterdir())[-1:]
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    return any(float(t.abs().max()) > 0 for name, t in saved.items() if "lora_B" in name)


def test_lora_synced_as_an_adapter(tiny_llama: Path, tmp_path: Path) -> None:
    run = tmp_path / "adapter"
    _train(
        run,
        *common(tiny_llama),
        "model.finetune=lora",
        "model.lora.r=8",
        "rollout.vllm.lora_sync=adapter",
        "trainer.learning_rate=1e-2",
        "trainer.max_steps=5",
    )
    assert_engine_follows_the_policy(_train_rows(run))
    assert _adapter_b_moved(run)


def test_lora_merged_on_part_of_a_fused_biased_layer(tmp_path: Path) -> None:
    """A merged sync of q and v alone on a Qwen2 folder (biases on q, k and v, which
    vLLM fuses into one layer with k): every weight of the fused layer reaches the
    engine, so k and the biases are the policy's, not uninitialised memory."""
    from vllm_folders import build_tiny_llama

    folder = build_tiny_llama(tmp_path / "qwen2", family="qwen2")
    assert json.loads((folder / "config.json").read_text())["model_type"] == "qwen2"
    run = tmp_path / "partial"
    _train(
        run,
        *common(folder),
        "model.finetune=lora",
        "model.lora.r=8",
        "model.lora.target_modules=[q_proj,v_proj]",
        "rollout.vllm.lora_sync=merged",
        "trainer.learning_rate=1e-2",
        "trainer.max_steps=4",
    )
    assert_engine_follows_the_policy(_train_rows(run))


def test_lora_merged_with_a_fully_trained_head(tiny_llama: Path, tmp_path: Path) -> None:
    run = tmp_path / "merged"
    _train(
        run,
        *common(tiny_llama),
        "model.finetune=lora",
        "model.lora.r=8",
        "model.lora.modules_to_save=[lm_head]",
        "rollout.vllm.lora_sync=merged",
        "trainer.learning_rate=1e-2",
        "trainer.max_steps=5",
    )
    assert_engine_follows_the_policy(_train_rows(run))
    assert _adapter_b_moved(run)
