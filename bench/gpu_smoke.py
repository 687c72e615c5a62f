"""The torch and Unsloth backends side by side on the same model and batch (GPU smoke).

Builds one local model folder (a random-weight Llama of the chosen size plus the
project's character tokenizer: no network), then runs each backend in a fresh process
(Unsloth must be imported before transformers; the torch side must not import it at
all), interleaved, for a few RL steps of the same config: sampling, rewards, packing or
padding, forward/backward and the optimizer step. Prints per backend the median step
time, peak accelerator memory and trained tokens/s, and the Unsloth / torch ratios.

Needs the [unsloth] extra in the running environment (``.venv-unsloth``). On a machine
without a GPU it still runs, on Unsloth's CPU fallback, as a check that the script works.

Usage: python bench/gpu_smoke.py [--size small|1b] [--steps 8] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

#: Model shapes: hidden size, layers, heads, MLP width.
SIZES = {"tiny": (64, 2, 4, 256), "small": (512, 8, 8, 1408), "1b": (2048, 16, 16, 5632)}
CHARSET = "=abcdefgh"


def build_folder(size: str, folder: Path) -> None:
    """A random-weight Llama with the character tokenizer, saved like a user's model."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from art_hydra.backends.tiny import build_tokenizer

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


def overrides(folder: Path, backend: str, steps: int) -> list[str]:
    return [
        f"backend={backend}",
        "backend.device=auto",
        "backend.gradient_checkpointing=false",
        f"model.name={folder}",
        "model.source=pretrained",
        "model.finetune=lora",
        "model.lora.modules_to_save=[lm_head]",
        "model.max_seq_length=64",
        "model.dtype=bfloat16",
        "task=reverse",
        "task.params.alphabet=abcdefgh",
        "trainer.per_device_train_batch_size=128",
        "trainer.learning_rate=1e-4",
        f"trainer.max_steps={steps}",
    ]


def one_side(folder: str, backend: str, steps: int) -> dict[str, float]:
    """Run ``steps`` RL steps with ``backend`` in this process and measure them."""
    import time

    from art_hydra.backends import prepare
    from art_hydra.config.composition import compose

    cfg = compose(overrides(Path(folder), backend, steps))
    prepare(cfg.backend)
    import torch

    from art_hydra.queue import StepChannel
    from art_hydra.run import build_trainer_and_producer

    trainer, producer = build_trainer_and_producer(cfg)
    cuda = trainer.loaded.device.type == "cuda"
    channel = StepChannel(cfg.queue, trainer.train_micro, cfg.timeouts.step_s)
    times, tokens = [], []
    try:
        for step in range(1, steps + 1):
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            for item in channel.produce(producer.make_inputs, "making the inputs", 600):
                channel.put(item)
            result = channel.result(step)
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
            tokens.append(result.trained_tokens)
    finally:
        channel.close()
    steady = times[2:] or times  # the first steps compile kernels and grow caches
    median = statistics.median(steady)
    return {
        "step_s": median,
        "tokens_per_s": statistics.median(tokens) / median,
        # Accelerator memory on a GPU; the process's peak resident memory on the CPU.
        "peak_mem_gb": (
            torch.cuda.max_memory_allocated() / 2**30
            if cuda
            else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        ),
        "device": str(trainer.loaded.device),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="small")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.side:  # a child process: one backend, results as JSON on the last line
        print(json.dumps(one_side(args.folder, args.side, args.steps)))
        return
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with tempfile.TemporaryDirectory(prefix="art_hydra_gpu_smoke_") as tmp:
        folder = Path(tmp) / "model"
        build_folder(args.size, folder)
        results: dict[str, list[dict[str, float]]] = {"torch": [], "unsloth": []}
        for _ in range(args.repeats):
            for side in results:
                cmd = [sys.executable, __file__, "--side", side, "--folder", str(folder)]
                cmd += ["--steps", str(args.steps)]
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=tmp)
                if proc.returncode:
                    raise SystemExit(f"{side} failed:\n{proc.stderr[-4000:]}")
                results[side].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    print(f"model: random Llama '{args.size}' {SIZES[args.size]}, LoRA, bf16, 128 rollouts/step")
    summary = {}
    for side, runs in results.items():
        summary[side] = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "device"}
        s = summary[side]
        print(
            f"{side:8s} on {runs[0]['device']}: step {s['step_s'] * 1e3:8.1f} ms   "
            f"{s['tokens_per_s']:10.0f} trained tokens/s   peak {s['peak_mem_gb']:.2f} GiB"
        )
    t, u = summary["torch"], summary["unsloth"]
    print(
        f"unsloth / torch: step time {u['step_s'] / t['step_s']:.2f}x, tokens/s "
        f"{u['tokens_per_s'] / t['tokens_per_s']:.2f}x, peak memory "
        f"{u['peak_mem_gb'] / t['peak_mem_gb']:.2f}x"
    )


if __name__ == "__main__":
    main()
