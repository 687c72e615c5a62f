"""Start-up: time from the command to the first optimizer step, against the imports alone.

Starts ``art-hydra`` (default RL job) and polls its run folder: the first line of
``metrics.jsonl`` marks the end of the first optimizer step. The floor is what no
trainer on this stack avoids: a fresh ``python -c`` importing torch, transformers, the
Llama modelling code and hydra. Both are measured interleaved, in fresh processes, and
the medians and their ratio are printed.

Usage: python bench/startup.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
FLOOR = (
    "import torch, transformers, hydra, omegaconf; import transformers.models.llama.modeling_llama"
)


def first_step(folder: Path) -> tuple[float, float]:
    """Seconds to the first optimizer step and to the end of a 2-step run."""
    metrics = folder / "metrics.jsonl"
    cmd = [str(BIN / "art-hydra"), "trainer.max_steps=2", "logging.progress_bar=off"]
    cmd += ["checkpoint.every_steps=0", f"hydra.run.dir={folder}"]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    first = None
    while proc.poll() is None:
        if first is None and metrics.exists() and metrics.stat().st_size > 0:
            first = time.perf_counter() - started
        time.sleep(0.005)
    total = time.perf_counter() - started
    if proc.returncode:
        raise SystemExit(f"{cmd} failed:\n{proc.stderr.read() if proc.stderr else ''}")
    return (first if first is not None else total), total


def floor() -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", FLOOR], check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    firsts, totals, floors = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            floors.append(floor())
            first, total = first_step(Path(tmp) / f"run{i}")
            firsts.append(first)
            totals.append(total)
    f, t, base = (statistics.median(x) for x in (firsts, totals, floors))
    print(f"cpu cores: {os.cpu_count()}, repeats: {args.repeats} (medians)")
    print(f"imports alone (torch, transformers, llama, hydra): {base:6.2f} s")
    print(f"command to the first optimizer step:               {f:6.2f} s  ({f / base:.2f}x)")
    print(f"command to the end of a 2-step run (exit):         {t:6.2f} s")


if __name__ == "__main__":
    main()
