"""Record what a short default run produces, for the golden regression test.

Run once with the code whose behaviour must be kept:

    python tests/engine/golden/record.py

First recorded at commit a18e8a5, before PPO iterations, family-aware packing and
optimizer parameter groups landed (none of which changed a bit). Recorded again when
shared prompts (``producer.share_prompts``), the fused AdamW kernel and the prompt pass
once per distinct prompt landed: they change the order of float sums, nothing else.
Against the first record, every step sampled the same completions with the same rewards,
and loss, grad norm, KL and entropy moved by at most 1.8e-6 relative (2e-7 for most).
Recorded a third time (issue 16) to add what a CPU cannot change and the exact CPU model;
every metric came out bit for bit what the second record held. Recorded a fourth time
(issue 19: on-policy old logprobs from the training forward, the chunked logprob head, no
decode mask on unpadded batches), on an AVX2 machine: every step sampled the same
completions with the same rewards; loss, grad norm, KL and entropy moved by at most 6e-7
relative against the old code on the same machine, and the old code itself was 1.1e-6
from the AVX512 record (the width of a CPU's vector sums alone).

It writes ``runs.json``: per configuration,

- ``metrics``: every step's metrics (floats as computed);
- ``generations``: per generation batch, what no CPU kernel can change: a SHA-256 of the
  sampled completion token ids, their count and total length, and every reward;
- ``weights_sha256``: a SHA-256 of the final weights;

plus the fingerprint of the machine (exact CPU model, torch build, CPU capability) that
bitwise float comparisons are only meaningful on.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
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
#: Metrics computed in Python from sampled tokens, rewards and the schedule alone: the
#: same on every CPU once the tokens are.
EXACT_METRICS = ("reward_mean", "reward_std", "learning_rate", "completion_length")
#: Metrics that come out of torch kernels: their last bits depend on the CPU's kernels.
FLOAT_METRICS = ("loss", "grad_norm", "kl", "entropy")
METRICS = (*EXACT_METRICS, *FLOAT_METRICS)


def cpu_model() -> str:
    """The exact CPU model (/proc/cpuinfo "model name"): two CPUs that report the same
    capability (AVX512) still round differently (Intel Xeon against AMD EPYC)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        import platform

        return platform.processor() or platform.machine()
    for line in lines:
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            return value.strip()
    return "unknown"


def fingerprint() -> dict[str, str]:
    import torch

    return {
        "cpu_model": cpu_model(),
        "torch": torch.__version__,
        "cpu": torch.backends.cpu.get_cpu_capability(),
    }


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


def tokens_sha256(completions: list[list[int]]) -> str:
    """A digest of a generation batch's sampled token ids (each completion ends with -1,
    so ``[1], [2]`` and ``[1, 2]`` differ)."""
    digest = hashlib.sha256()
    for ids in completions:
        digest.update(json.dumps([*ids, -1]).encode())
    return digest.hexdigest()


@contextlib.contextmanager
def watching_generations() -> Iterator[list[dict[str, Any]]]:
    """What every generation batch sampled and earned, read as the run goes.

    The torch rollout engine's own ``sample`` and the producer's ``score_rewards`` still
    do the work; this only sees their results (the engine stays untouched)."""
    from art_hydra.engine import producer
    from art_hydra.engine.rollout import torch_engine

    seen: list[dict[str, Any]] = []
    real_sample, real_score = torch_engine.sample, producer.score_rewards

    def sample(*args: Any, **kwargs: Any) -> Any:
        completions, logprobs = real_sample(*args, **kwargs)
        seen.append(
            {
                "tokens_sha256": tokens_sha256(completions),
                "completions": len(completions),
                "completion_tokens": sum(len(c) for c in completions),
            }
        )
        return completions, logprobs

    def score_rewards(*args: Any, **kwargs: Any) -> Any:
        scores = real_score(*args, **kwargs)
        seen[-1]["rewards"] = list(scores.totals)
        return scores

    torch_engine.sample, producer.score_rewards = sample, score_rewards
    try:
        yield seen
    finally:
        torch_engine.sample, producer.score_rewards = real_sample, real_score


def run(name: str, overrides: list[str]) -> dict[str, Any]:
    from art_hydra import compose, train
    from art_hydra.engine.metrics import read_metrics

    with tempfile.TemporaryDirectory() as tmp, watching_generations() as generations:
        train(compose([*COMMON, *overrides]), run_dir=tmp)
        rows = read_metrics(Path(tmp))
        return {
            "overrides": overrides,
            "metrics": [{k: row[k] for k in ("step", *METRICS)} for row in rows],
            "generations": list(generations),
            "weights_sha256": weights_sha256(Path(tmp)),
        }


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "runs.json"
    out = {"fingerprint": fingerprint(), "common": COMMON, "runs": {}}
    for name, overrides in RUNS.items():
        out["runs"][name] = run(name, overrides)
        print(name, out["runs"][name]["weights_sha256"], file=sys.stderr)
    target.write_text(json.dumps(out, indent=1) + "\n")
