"""Record what a short default run produces, for the bit-for-bit regression test.

Run once with the code whose behaviour must be kept:

    python tests/engine/golden/record.py

First recorded at commit a18e8a5, before PPO iterations, family-aware packing and
optimizer parameter groups landed (none of which changed a bit). Recorded again when
shared prompts (``producer.share_prompts``), the fused AdamW kernel and the prompt pass
once per distinct prompt landed: they change the order of float sums, nothing else.
Against the first record, every step sampled the same completions with the same rewards,
and loss, grad norm, KL and entropy moved by at most 1.8e-6 relative (2e-7 for most).

It writes ``runs.json``: per configuration, every step's metrics and a SHA-256 of the
final weights, plus the fingerprint of the machine (torch build, CPU capability) that
bitwise comparisons are only meaningful on.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

#: Short runs of the default job; each exercises a different branch of the step.
RUNS: dict[str, list[str]] = {
    "default_full": [],
    "lora_with_kl": ["model.finetune=lora", "model.lora.r=4", "rl.beta=0.04"],
    "cispo": ["rl.loss_type=cispo", "rl.epsilon_high=5.0"],
}
COMMON = [
    "trainer.max_steps=5",
    "trainer.per_device_train_batch_size=32",
    "checkpoint.every_steps=0",
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
    "producer.log_completions=0",
]
METRICS = ("reward_mean", "reward_std", "loss", "grad_norm", "learning_rate", "kl", "entropy")


def fingerprint() -> dict[str, str]:
    import torch

    return {"torch": torch.__version__, "cpu": torch.backends.cpu.get_cpu_capability()}


def weights_sha256(run_dir: Path) -> str:
    import torch
    from safetensors.torch import load_file

    ckpt = sorted((run_dir / "checkpoints").glob("step-*"))[-1]
    files = sorted(ckpt.glob("*.safetensors"))
    digest = hashlib.sha256()
    for path in files:
        tensors = load_file(path)
        for name in sorted(tensors):
            digest.update(name.encode())
            digest.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()


def run(name: str, overrides: list[str]) -> dict[str, Any]:
    from art_hydra import compose, train
    from art_hydra.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp:
        train(compose([*COMMON, *overrides]), run_dir=tmp)
        rows = read_metrics(Path(tmp))
        return {
            "overrides": overrides,
            "metrics": [{k: row[k] for k in ("step", *METRICS)} for row in rows],
            "weights_sha256": weights_sha256(Path(tmp)),
        }


if __name__ == "__main__":
    out = {"fingerprint": fingerprint(), "common": COMMON, "runs": {}}
    for name, overrides in RUNS.items():
        out["runs"][name] = run(name, overrides)
        print(name, out["runs"][name]["weights_sha256"], file=sys.stderr)
    (HERE / "runs.json").write_text(json.dumps(out, indent=1) + "\n")
