"""Peak memory and time of the logprob/entropy step: full logits (before) vs chunked head
at trained positions (after), on a tiny model with Qwen's 151,936-token vocabulary.

The step is what a training micro-batch does for its logprobs: forward over packed rows,
logprob and entropy per trained token, backward of their sum. "full" is the path before
issue 19 (the model's forward, then a log-softmax over every position's logits); "chunked"
is :func:`art_hydra.engine.trainer.packed_logprobs`
(:mod:`art_hydra.engine.rl.logprobs`). Sequences are
256 tokens, a quarter of them prompt, packed four to a row.

Memory: on CUDA ``torch.cuda.max_memory_allocated`` over the step; on CPU the process's
resident high-water mark (``getrusage``) in a fresh process per measurement, minus its
resident memory before the step. Time: the median of further steps. The two paths are
measured interleaved; the full path is skipped where its logits alone (about 4.2 float32
``[tokens x vocab]`` copies) would not fit in the memory available.

Usage: python bench/logprob_memory.py [--tokens 1024 4096 16384] [--repeats 2] [--steps 3]
       [--device cpu|cuda] [--frozen-head]
Importable: :func:`measure_step` (one measurement in this process) and :func:`compare`
(the table), for ``bench/gpu_smoke.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

VOCAB = 151_936
SEQUENCE = 256
PROMPT = 64
CAPACITY = 1024
#: float32 [tokens x vocab] copies the full path keeps alive (measured: 4.2).
FULL_COPIES = 4.2


def build_model(device: str, vocab: int = VOCAB, hidden: int = 64, layers: int = 2) -> Any:
    """A random-weight Llama (float32, sdpa, untied head) with the given vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=CAPACITY,
        tie_word_embeddings=False,
        attn_implementation="sdpa",
    )
    return LlamaForCausalLM(config).to(device).train()


def build_batch(tokens: int, device: str, vocab: int = VOCAB) -> Any:
    """``tokens`` tokens of 256-token sequences (64 prompt), packed four to a row."""
    import torch

    from art_hydra.engine.packing import PACKED, Sequence, pack

    gen = torch.Generator().manual_seed(1)
    seqs = [
        Sequence(
            tokens=torch.randint(1, vocab, (SEQUENCE,), generator=gen).tolist(),
            prompt_len=PROMPT,
            advantage=1.0,
            old_logprobs=[-1.0] * (SEQUENCE - PROMPT),
        )
        for _ in range(max(1, tokens // SEQUENCE))
    ]
    return pack(seqs, CAPACITY, 0, PACKED).to(torch.device(device))


def full_logprobs(model: Any, batch: Any, settings: Any) -> tuple[Any, Any]:
    """The path before issue 19: the model's logits at every position, then
    ``token_logprobs`` over all of them."""
    from art_hydra.engine.rl.sampling import token_logprobs

    dtype = model.get_input_embeddings().weight.dtype
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask(dtype),
        position_ids=batch.position_ids,
    ).logits
    return token_logprobs(logits, batch.targets, settings)


def one_step(model: Any, batch: Any, path: str) -> None:
    """Forward, logprob and entropy per trained token, backward."""
    import torch

    from art_hydra.engine.rl.sampling import SamplingSettings
    from art_hydra.engine.trainer import packed_logprobs

    settings = SamplingSettings(temperature=1.0, suppress_ids=(0,))
    fn = full_logprobs if path == "full" else packed_logprobs
    logprobs, entropy = fn(model, batch, settings)
    mask = batch.loss_mask
    loss = -(torch.where(mask > 0, logprobs, torch.zeros_like(logprobs)) * mask).sum()
    float((entropy * mask).sum())  # the statistic the trainer reads
    loss.backward()
    model.zero_grad(set_to_none=True)


_DEFAULT_CHUNKS: dict[str, tuple[int, int]] = {}


def _chunk_from_environment() -> None:
    """The bench's chunk size (``--chunk-elements``), in this process and its children."""
    from art_hydra.engine.rl import logprobs

    defaults = _DEFAULT_CHUNKS.setdefault(
        "sizes", (logprobs.CHUNK_ELEMENTS, logprobs.ACCELERATOR_CHUNK_ELEMENTS)
    )
    value = os.environ.get("ART_HYDRA_CHUNK_ELEMENTS")
    sizes = (int(value), int(value)) if value else defaults
    logprobs.CHUNK_ELEMENTS, logprobs.ACCELERATOR_CHUNK_ELEMENTS = sizes


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def measure_step(
    path: str, tokens: int, device: str, steps: int = 3, frozen_head: bool = False
) -> dict[str, float]:
    """Peak memory (MB, over the first step) and median time (s, further steps) of the
    logprob step in this process. On CPU the peak is only right in a fresh process.
    ``frozen_head``: the head takes no gradient (as under LoRA without modules_to_save)."""
    import torch

    _chunk_from_environment()
    model = build_model(device)
    model.get_output_embeddings().weight.requires_grad_(not frozen_head)
    batch = build_batch(tokens, device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    if device == "cuda":
        sync()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss_mb()
    start = time.perf_counter()
    one_step(model, batch, path)
    sync()
    first = time.perf_counter() - start
    if device == "cuda":
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        one_step(model, batch, path)
        sync()
        times.append(time.perf_counter() - start)
    return {
        "peak_mb": peak,
        "seconds": statistics.median(times) if times else first,
        "tokens": float(batch.real_tokens),
        "trained": float(batch.loss_mask.sum()),
    }


def _fresh(path: str, tokens: int, device: str, steps: int, frozen_head: bool) -> dict[str, float]:
    code = (
        "import json, sys; sys.path.insert(0, sys.argv[1]); import logprob_memory as m; "
        "print(json.dumps(m.measure_step(sys.argv[2], int(sys.argv[3]), sys.argv[4], "
        "int(sys.argv[5]), sys.argv[6] == '1')))"
    )
    here = os.path.dirname(os.path.abspath(__file__))
    frozen = "1" if frozen_head else "0"
    cmd = [sys.executable, "-c", code, here, path, str(tokens), device, str(steps), frozen]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _available_mb(device: str) -> float:
    if device == "cuda":
        import torch

        free, _ = torch.cuda.mem_get_info()
        return free / 2**20
    with open("/proc/meminfo") as f:
        info = dict(line.split(":", 1) for line in f)
    return int(info["MemAvailable"].split()[0]) / 1024


def compare(
    token_counts: list[int],
    device: str,
    repeats: int = 2,
    steps: int = 3,
    frozen_head: bool = False,
) -> list[dict[str, Any]]:
    """Both paths at each token count, interleaved (full, chunked, full, ...); per count
    the lowest peak and the median time of each, and their ratios. The full path is
    skipped (None) where its estimated peak exceeds 80% of the memory available."""
    rows = []
    for tokens in token_counts:
        need = FULL_COPIES * tokens * VOCAB * 4 / 2**20
        paths = ["full", "chunked"] if need < 0.8 * _available_mb(device) else ["chunked"]
        seen: dict[str, list[dict[str, float]]] = {p: [] for p in paths}
        for _ in range(repeats):
            for path in paths:
                if device == "cuda":
                    seen[path].append(measure_step(path, tokens, device, steps, frozen_head))
                else:
                    seen[path].append(_fresh(path, tokens, device, steps, frozen_head))
        row: dict[str, Any] = {"tokens": tokens, "full_estimate_mb": need}
        for path in ("full", "chunked"):
            got = seen.get(path)
            row[f"{path}_mb"] = min(r["peak_mb"] for r in got) if got else None
            row[f"{path}_s"] = statistics.median(r["seconds"] for r in got) if got else None
        if row["full_mb"] is not None:
            row["memory_ratio"] = row["full_mb"] / row["chunked_mb"]
            row["time_ratio"] = row["chunked_s"] / row["full_s"]
        rows.append(row)
        print(_line(row), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    if row["full_mb"] is None:
        return (
            f"{row['tokens']:>6} tokens  full: skipped (about {row['full_estimate_mb']:,.0f} MB "
            f"of logits)  chunked {row['chunked_mb']:8.0f} MB {row['chunked_s']:.3f} s"
        )
    return (
        f"{row['tokens']:>6} tokens  full {row['full_mb']:8.0f} MB {row['full_s']:.3f} s  "
        f"chunked {row['chunked_mb']:8.0f} MB {row['chunked_s']:.3f} s  "
        f"memory {row['memory_ratio']:.1f}x less, time {row['time_ratio']:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--device", default=None, help="cpu or cuda (default: cuda if any)")
    parser.add_argument(
        "--frozen-head", action="store_true", help="the head takes no gradient (LoRA's default)"
    )
    parser.add_argument("--chunk-elements", type=int, default=None, help="logits per chunk")
    args = parser.parse_args()
    import torch

    from art_hydra.engine.rl import logprobs

    # The children of a CPU run read it from the environment.
    os.environ["ART_HYDRA_CHUNK_ELEMENTS"] = str(args.chunk_elements or "")
    _chunk_from_environment()
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = device == "cpu"
    chunk = logprobs.CHUNK_ELEMENTS if cpu else logprobs.ACCELERATOR_CHUNK_ELEMENTS

    print(
        f"logprob step, tiny Llama (hidden 64, 2 layers), vocabulary {VOCAB:,}, {device}; "
        f"sequences of {SEQUENCE} tokens ({PROMPT} prompt), {args.repeats} interleaved repeats"
        + (", frozen head" if args.frozen_head else ", trained head")
        + f", chunks of {chunk:,} logits"
    )
    compare(args.tokens, device, args.repeats, args.steps, args.frozen_head)


if __name__ == "__main__":
    main()
