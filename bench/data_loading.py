"""Reading hostile and large data files: time and peak memory, each in a fresh process.

Prints, for a 50 MB single line (refused by its size before it is parsed) and for a
1,000,000-line file (streamed: checked by the world pre-flight, then loaded as the run
loads it), the wall time and the process's peak resident memory, next to a bare
``import art_hydra`` as the baseline.

Usage: python bench/data_loading.py
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CHILD = """
import resource, sys, time
from art_hydra import compose
from art_hydra.preflight import world_problems
start = time.perf_counter()
cfg = compose(["task=jsonl", "task.path=" + sys.argv[1], "rl.max_prompt_length=32",
               "rl.max_completion_length=32", "model=qwen2_5_0_5b_instruct",
               "model.name=Qwen/Qwen2.5-0.5B-Instruct"])
problems = world_problems(cfg, None)
checked = time.perf_counter() - start
if sys.argv[2] == "load":
    from art_hydra.tasks import build_task
    examples = len(build_task(cfg).examples)
else:
    examples = 0
print(checked, time.perf_counter() - start, examples, len(problems),
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
"""


def measure(path: str, mode: str) -> tuple[float, float, int, int, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, path, mode], capture_output=True, text=True, check=True
    ).stdout.split()
    return float(out[0]), float(out[1]), int(out[2]), int(out[3]), float(out[4])


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        huge = Path(tmp) / "huge.jsonl"
        with open(huge, "w") as handle:
            handle.write('{"prompt": "ab=", "answer": "ba"}\n{"prompt": "')
            handle.write("x" * (50 << 20))
            handle.write('", "answer": "y"}\n')
        many = Path(tmp) / "many.jsonl"
        start = time.perf_counter()
        with open(many, "w") as handle:
            for i in range(1_000_000):
                handle.write(
                    json.dumps({"prompt": f"{i % 997}+{i % 13}=", "answer": str(i)}) + "\n"
                )
        print(f"wrote {many.stat().st_size / 2**20:.0f} MiB in {time.perf_counter() - start:.1f}s")
        base = subprocess.run(
            [
                sys.executable,
                "-c",
                "import resource, art_hydra; print(resource.getrusage("
                "resource.RUSAGE_SELF).ru_maxrss / 1024)",
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        print(f"import art_hydra alone: peak {float(base):.0f} MiB")
        checked, _, _, problems, peak = measure(str(huge), "check")
        print(f"50 MB line: refused in {checked:.2f}s ({problems} problem), peak {peak:.0f} MiB")
        checked, total, examples, problems, peak = measure(str(many), "load")
        print(
            f"1M lines ({many.stat().st_size / 2**20:.0f} MiB): checked in {checked:.1f}s, "
            f"checked and loaded ({examples:,} examples) in {total:.1f}s, peak {peak:.0f} MiB"
        )


if __name__ == "__main__":
    main()
