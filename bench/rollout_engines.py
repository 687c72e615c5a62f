"""The rollout engines side by side: rollout.engine=torch against rollout.engine=vllm on
the same model folder, task and settings, in one run of this script.

Runs in the vLLM environment (make test-vllm makes .venv-vllm; on a GPU machine one with
``pip install "art-hydra[vllm]"``). Each engine trains the same short RL job through the
real CLI; the script prints, per engine: the engine's start-up, the median step time
after the first, the median sampling_mismatch_mean/max at the first step and after
weights were synced (steps 2+), and the ratio of the step times.

Usage: python bench/rollout_engines.py [--folder MODEL_DIR] [--steps 8] [--finetune full]
       [--eager true]  (without --folder, a tiny llama folder with heads vLLM's CPU
       attention runs is written to a temporary folder)
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def tiny_folder(out: Path) -> Path:
    """A random-weight llama (head_dim 32, untied head) with a character tokenizer."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    for char in "abcdefghijklmnopqrstuvwxyz0123456789 +=-*:.,?":
        vocab[char] = len(vocab)
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        padding_side="left",
    )
    config = AutoConfig.for_model(
        "llama",
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=256,
        tie_word_embeddings=False,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def run(engine: str, folder: Path, work: Path, args: argparse.Namespace) -> dict:
    out = work / engine
    command = [
        str(Path(sys.executable).with_name("art-hydra")),
        "model=pretrained",
        f"model.name={folder}",
        f"model.finetune={args.finetune}",
        "model.dtype=float32",
        f"rollout.engine={engine}",
        f"rollout.vllm.enforce_eager={args.eager}",
        f"trainer.max_steps={args.steps}",
        "trainer.learning_rate=1e-3",
        "logging.progress_bar=off",
        "logging.plot=false",
        "logging.tensorboard=false",
        "checkpoint.every_steps=1000",
        f"hydra.run.dir={out}",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, env=None, timeout=1200)
    if proc.returncode != 0:
        raise SystemExit(f"{engine} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    log = (out / "art_hydra.log").read_text()
    started = re.search(r"started in ([\d.]+)s", log)
    return {
        "start_s": float(started.group(1)) if started else 0.0,
        "step_s": statistics.median(r["step_time_s"] for r in rows[1:]),
        "first_mismatch": (rows[0]["sampling_mismatch_mean"], rows[0]["sampling_mismatch_max"]),
        "synced_mismatch": (
            statistics.median(r["sampling_mismatch_mean"] for r in rows[1:]),
            max(r["sampling_mismatch_max"] for r in rows[1:]),
        ),
        "moved": sum(1 for r in rows[:-1] if (r.get("grad_norm") or 0) > 0),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--finetune", choices=("full", "lora"), default="full")
    parser.add_argument("--eager", default="true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        folder = args.folder or tiny_folder(work / "model")
        found = {engine: run(engine, folder, work, args) for engine in ("torch", "vllm")}
    for engine, f in found.items():
        print(
            f"{engine:6s} start-up {f['start_s']:6.2f}s  step {f['step_s'] * 1000:8.1f} ms  "
            f"mismatch step 1 mean/max {f['first_mismatch'][0]:.2e}/{f['first_mismatch'][1]:.2e}"
            f"  after syncs {f['synced_mismatch'][0]:.2e}/{f['synced_mismatch'][1]:.2e}"
            f"  ({f['moved']} updates before the last step)"
        )
    ratio = found["vllm"]["step_s"] / found["torch"]["step_s"]
    print(f"step time vllm/torch: {ratio:.2f}x ({args.finetune}, {args.steps} steps)")


if __name__ == "__main__":
    main()
