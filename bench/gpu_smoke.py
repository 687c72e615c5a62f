"""GPU smoke: the backends side by side, bf16 master-weight memory, logprob memory, the
rollout engines side by side.

Four parts, each measured in fresh child processes (Unsloth must be imported before
transformers; the torch side must not import it at all), interleaved:

1. ``backends``: the torch and Unsloth backends on the same random-weight Llama and
   the same RL config (sampling, rewards, packing, forward/backward, optimizer step):
   median step time, peak accelerator memory, trained tokens/s, Unsloth / torch
   ratios. Without the [unsloth] extra installed, the torch side alone.
2. ``precision``: bf16 full fine-tuning with float32 master weights (the default,
   ``model.master_weights=true``) against pure bf16 weights
   (``model.master_weights=false``): memory held after a step (weights, optimizer
   state) and peak memory, step time, and the share of weights one step changed.
3. ``logprobs``: peak memory and time of the logprob/entropy step (forward and
   backward) at a real vocabulary (151,936 tokens), the chunked completion-only head
   against the full ``[tokens x vocab]`` logits (``bench/logprob_memory.py``).
4. ``rollout``: ``rollout.engine=torch`` against ``rollout.engine=vllm`` (colocated,
   weights synced after every step) on the same model and full fine-tune: median step
   time, the inputs' share (sampling + rewards + packing), generated tokens/s, device
   memory in use, the engine's start-up and the logprob mismatch. Without vLLM
   installed (the [vllm] extra), the torch side alone, and it says so.

Builds its model folders locally (random weights plus the project's character
tokenizer: no network). On a machine without a GPU it still runs (the process's peak
resident memory stands in for accelerator memory), as a check that the script works.

Usage: python bench/gpu_smoke.py [--parts backends,precision,logprobs,rollout] [--size small|1b]
       [--steps 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: Model shapes: hidden size, layers, heads, MLP width.
SIZES = {"tiny": (64, 2, 4, 256), "small": (512, 8, 8, 1408), "1b": (2048, 16, 16, 5632)}
CHARSET = "=abcdefgh"
PARTS = ("backends", "precision", "logprobs", "rollout")
#: The precision variants: name -> overrides on top of a full fine-tune in bf16.
PRECISION = {"bf16 + fp32 masters": "true", "pure bf16": "false"}


def build_folder(size: str, folder: Path) -> None:
    """A random-weight Llama with the character tokenizer, saved like a user's model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from art_hydra.engine.backends.tiny import build_tokenizer

    hidden, layers, heads, mlp = SIZES[size]
    tokenizer = build_tokenizer(CHARSET)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=mlp,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def overrides(
    folder: Path, backend: str, steps: int, variant: str | None, engine: str = "torch"
) -> list[str]:
    """The RL run the parts measure; ``variant`` (master_weights) makes it a full fine-tune,
    ``engine`` picks the rollout engine."""
    finetune = ["model.finetune=lora", "model.lora.modules_to_save=[lm_head]"]
    if variant is not None:
        finetune = ["model.finetune=full", f"model.master_weights={variant}"]
    return [
        f"rollout.engine={engine}",
        f"backend={backend}",
        "backend.device=auto",
        "backend.gradient_checkpointing=false",
        f"model.name={folder}",
        "model.source=pretrained",
        *finetune,
        "model.max_seq_length=64",
        "model.dtype=bfloat16",
        "task=reverse",
        "task.params.alphabet=abcdefgh",
        "trainer.per_device_train_batch_size=128",
        "trainer.learning_rate=1e-5",
        f"trainer.max_steps={steps}",
        "logging.progress_bar=off",
    ]


def _peak_gb(cuda: bool) -> float:
    """Accelerator memory on a GPU; the process's peak resident memory on the CPU."""
    import torch

    if cuda:
        return torch.cuda.max_memory_allocated() / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def one_side(
    folder: str, backend: str, steps: int, variant: str | None, engine: str = "torch"
) -> dict[str, Any]:
    """Run ``steps`` RL steps with ``backend`` in this process and measure them."""
    import time

    from art_hydra.config.composition import compose
    from art_hydra.engine.backends import prepare

    cfg = compose(overrides(Path(folder), backend, steps, variant, engine))
    prepare(cfg.backend)
    import torch

    from art_hydra.engine.queue import StepChannel, StepWork
    from art_hydra.engine.recipe import build_trainer_and_producer

    trainer, producer = build_trainer_and_producer(cfg)
    cuda = trainer.loaded.device.type == "cuda"
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    # Kept on the host, so the copy does not count in the accelerator's peak.
    before = [p.detach().to("cpu", copy=True) for p in params] if variant is not None else []
    channel = StepChannel(cfg.queue, trainer.train_step, cfg.timeouts.step_s)
    times, made, tokens, generated, mismatch = [], [], [], [], []
    changed_share = float("nan")
    try:
        for step in range(1, steps + 1):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            inputs = channel.run_on_trainer_thread(producer.make_inputs, "making the inputs", 600)
            if cuda:
                torch.cuda.synchronize()
            made.append(time.perf_counter() - start)
            channel.put(StepWork(inputs))
            result = channel.result(step)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            tokens.append(result.trained_tokens)
            info = inputs[0].info
            generated.append(info.get("completion_length", 0.0) * info.get("completions", 0.0))
            mismatch.append(result.stats.get("sampling_mismatch_max", float("nan")))
            producer.refresh_sampler()  # as the run does after every optimizer step
            if step == 1 and before:
                pairs = zip(params, before, strict=True)
                changed = sum(int((p.detach().cpu() != b).sum()) for p, b in pairs)
                changed_share = changed / sum(b.numel() for b in before)
    finally:
        channel.close()
    steady = times[2:] or times  # the first steps compile kernels and grow caches
    median = statistics.median(steady)
    in_use = float("nan")
    if cuda:
        free, total = torch.cuda.mem_get_info()
        in_use = (total - free) / 2**30  # vLLM's pool too, which the allocator's peak misses
    engine_start = getattr(producer.engine, "start_s", 0.0)
    producer.engine.close()
    out: dict[str, Any] = {
        "step_s": median,
        "generated_per_s": statistics.median(
            g / m for g, m in zip(generated[2:] or generated, made[2:] or made, strict=True)
        ),
        "in_use_gb": in_use,
        "engine_start_s": engine_start,
        "mismatch_max": max(mismatch),
        # Rollouts, rewards and packing; the rest of the step is the train step.
        "inputs_s": statistics.median(made[2:] or made),
        "tokens_per_s": statistics.median(tokens) / median,
        "peak_mem_gb": _peak_gb(cuda),
        "device": str(trainer.loaded.device),
    }
    if variant is not None:
        # What stays between steps: weights (and masters), optimizer moments.
        out["held_gb"] = torch.cuda.memory_allocated() / 2**30 if cuda else float("nan")
        out["weight_dtype"] = str(params[0].dtype).replace("torch.", "")
        out["changed_share"] = changed_share
    return out


def _child(args: list[str], env: dict[str, str], cwd: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, *args], env=env, capture_output=True, text=True, cwd=cwd
    )
    if proc.returncode:
        raise SystemExit(f"{' '.join(args)} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _median(runs: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {**runs[0], **{k: statistics.median(r[k] for r in runs) for k in keys}}


def part_backends(args: argparse.Namespace, folder: Path, env: dict[str, str], tmp: str) -> None:
    sides = ["torch"]
    if importlib.util.find_spec("unsloth") is not None:
        sides.append("unsloth")
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            child = ["--side", side, "--folder", str(folder), "--steps", str(args.steps)]
            results[side].append(_child(child, env, tmp))
    print(f"== backends: random Llama '{args.size}' {SIZES[args.size]}, LoRA, bf16, 128 rollouts")
    summary = {side: _median(runs) for side, runs in results.items()}
    for side, s in summary.items():
        print(
            f"{side:8s} on {s['device']}: step {s['step_s'] * 1e3:8.1f} ms   "
            f"{s['tokens_per_s']:10.0f} trained tokens/s   peak {s['peak_mem_gb']:.2f} GiB"
        )
    if "unsloth" not in summary:
        print("unsloth: not installed here (the [unsloth] extra); torch side only")
        return
    t, u = summary["torch"], summary["unsloth"]
    print(
        f"unsloth / torch: step time {u['step_s'] / t['step_s']:.2f}x, tokens/s "
        f"{u['tokens_per_s'] / t['tokens_per_s']:.2f}x, peak memory "
        f"{u['peak_mem_gb'] / t['peak_mem_gb']:.2f}x"
    )


def part_precision(args: argparse.Namespace, folder: Path, env: dict[str, str], tmp: str) -> None:
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in PRECISION}
    for _ in range(args.repeats):
        for name, flag in PRECISION.items():
            child = ["--side", "torch", "--folder", str(folder), "--steps", str(args.steps)]
            results[name].append(_child([*child, "--variant", flag], env, tmp))
    print(f"== precision: random Llama '{args.size}' {SIZES[args.size]}, full fine-tune, bf16")
    summary = {name: _median(runs) for name, runs in results.items()}
    for name, s in summary.items():
        print(
            f"{name:20s} weights {s['weight_dtype']:8s} held after a step "
            f"{s['held_gb']:6.2f} GiB  peak {s['peak_mem_gb']:6.2f} GiB  step "
            f"{s['step_s'] * 1e3:7.1f} ms (inputs {s['inputs_s'] * 1e3:.0f} ms)  "
            f"weights changed by step 1 {s['changed_share']:.1%}"
        )
    m, p = (summary[name] for name in PRECISION)
    print(
        f"masters / pure bf16: held {m['held_gb'] / p['held_gb']:.2f}x, peak "
        f"{m['peak_mem_gb'] / p['peak_mem_gb']:.2f}x, step time {m['step_s'] / p['step_s']:.2f}x"
    )


def part_rollout(args: argparse.Namespace, folder: Path, env: dict[str, str], tmp: str) -> None:
    """The torch sampler against vLLM on the same full fine-tune (see the module doc)."""
    sides = ["torch"]
    if importlib.util.find_spec("vllm") is not None:
        sides.append("vllm")
    results: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            child = ["--side", "torch", "--folder", str(folder), "--steps", str(args.steps)]
            results[side].append(_child([*child, "--variant", "true", "--engine", side], env, tmp))
    print(f"== rollout: random Llama '{args.size}' {SIZES[args.size]}, full fine-tune, bf16")
    summary = {side: _median(runs) for side, runs in results.items()}
    for side, s in summary.items():
        print(
            f"{side:6s} on {s['device']}: step {s['step_s'] * 1e3:8.1f} ms (inputs "
            f"{s['inputs_s'] * 1e3:.0f} ms)  {s['generated_per_s']:10.0f} generated tokens/s  "
            f"in use {s['in_use_gb']:.2f} GiB  start-up {s['engine_start_s']:.1f}s  "
            f"mismatch max {s['mismatch_max']:.2e}"
        )
    if "vllm" not in summary:
        print("vllm: not installed here (the [vllm] extra); torch side only")
        return
    t, v = summary["torch"], summary["vllm"]
    print(
        f"vllm / torch: step time {v['step_s'] / t['step_s']:.2f}x, generated tokens/s "
        f"{v['generated_per_s'] / t['generated_per_s']:.2f}x, memory in use "
        f"{v['in_use_gb'] / t['in_use_gb']:.2f}x"
    )


def part_logprobs(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import logprob_memory
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    tokens = [int(t) for t in args.logprob_tokens.split(",")]
    print(
        f"== logprobs: tiny Llama, vocabulary {logprob_memory.VOCAB:,}, {device}, forward and "
        "backward of the logprob/entropy step (full [tokens x vocab] logits vs chunked head)"
    )
    logprob_memory.compare(tokens, device, repeats=args.repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS))
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--logprob-tokens", default="1024,4096,16384")
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    parser.add_argument("--engine", default="torch", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a child process: one run, results as JSON on the last line
        result = one_side(args.folder, args.side, args.steps, args.variant, args.engine)
        print(json.dumps(result))
        return
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {list(PARTS)}")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="art_hydra_gpu_smoke_") as tmp:
        folder = Path(tmp) / "model"
        if {"backends", "precision", "rollout"} & set(parts):
            build_folder(args.size, folder)
        if "backends" in parts:
            part_backends(args, folder, env, tmp)
        if "precision" in parts:
            part_precision(args, folder, env, tmp)
        if "logprobs" in parts:
            part_logprobs(args)
        if "rollout" in parts:
            part_rollout(args, folder, env, tmp)


if __name__ == "__main__":
    main()
