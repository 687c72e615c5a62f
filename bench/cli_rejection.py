"""How fast does the CLI reject a bad config, next to merely importing Hydra?

Runs, interleaved in one process tree so that machine load affects all alike:
  A) python -c "import hydra, omegaconf"             (the floor any Hydra CLI pays)
  P) a plain Hydra app composing a one-line config through Hydra's ``compose`` API
     (what composing anything costs here: Hydra's machinery and its plugin scan)
  I) python -c "import art_hydra.conf"               (art_hydra's config layer, which
     registers the schemas the config files name)
  H) I, then Hydra composing the shipped config with B's override through its own
     ``compose`` API: no art_hydra check, no report
  B) art-hydra trainer.gradient_accumulation_steps=2  (RL + accumulation: rejected)
  C) art-hydra trainer.learning_rate=abc +trainer.lerning_rate=1 algorithm=foo
     (three override errors, found by the diagnosis path)
and prints the medians, each against A, and the refusal's parts: the config layer's
import (I - A), Hydra's composition of the shipped config (H - I), and art_hydra's checks
and report (B - H); P says how much of A's 2.0x any Hydra app composing a config spends.
Target: B/A <= 2.0.

``--baseline DIR`` adds B and C run from another checkout of art_hydra (its folder put
first on ``PYTHONPATH``, say a ``git worktree`` of an older commit), interleaved with the
rest, and prints the current tree's time as a ratio of the baseline's.

Bytecode is cached as an install has it (``PYTHONDONTWRITEBYTECODE`` is dropped, the
cache kept in a temporary ``PYTHONPYCACHEPREFIX`` folder, so no tree gets written into):
compiling the sources at every start is not what a user's command pays.

Usage: python bench/cli_rejection.py [--repeats 9] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

CASES = {
    "import hydra, omegaconf": [sys.executable, "-c", "import hydra, omegaconf"],
    "a plain Hydra app: compose a 1-line config": [
        sys.executable,
        "-c",
        "import os, shutil, tempfile\n"
        "from hydra import compose, initialize_config_dir\n"
        "folder = tempfile.mkdtemp()\n"
        "with open(os.path.join(folder, 'c.yaml'), 'w') as f:\n"
        "    f.write('a: 1')\n"
        "with initialize_config_dir(config_dir=folder, version_base=None):\n"
        "    compose('c', overrides=['a=2'])\n"
        "shutil.rmtree(folder)",
    ],
    "import art_hydra.conf": [sys.executable, "-c", "import art_hydra.conf"],
    "Hydra alone: compose, no checks": [
        sys.executable,
        "-c",
        "from hydra import compose, initialize_config_module\n"
        "from art_hydra.config.store import register_configs\n"
        "register_configs()\n"
        "with initialize_config_module(config_module='art_hydra.conf', version_base=None):\n"
        "    compose('config', overrides=['trainer.gradient_accumulation_steps=2'])",
    ],
    "art-hydra reject (validator)": [
        sys.executable,
        "-m",
        "art_hydra",
        "trainer.gradient_accumulation_steps=2",
    ],
    "art-hydra reject (3 bad overrides)": [
        sys.executable,
        "-m",
        "art_hydra",
        "trainer.learning_rate=abc",
        "+trainer.lerning_rate=1",
        "algorithm=foo",
    ],
}


def run_once(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float]:
    """The command's wall time and its CPU time (user + system, which a loaded machine
    inflates far less than the wall clock)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if cmd[1] == "-c":  # a reference case: it must simply succeed
        if proc.returncode:
            raise SystemExit(f"the reference case {cmd} failed:\n{proc.stderr}")
        return elapsed, cpu
    rejected = proc.returncode == 1 and "The configuration cannot run" in proc.stderr
    if not rejected or "Traceback" in proc.stderr:
        raise SystemExit(f"expected a clean rejection from {cmd}, got:\n{proc.stderr}")
    return elapsed, cpu


def _environments(baseline: str | None) -> dict[str, dict[str, str]]:
    """The environment of each side: this tree's (as the interpreter finds it) and the
    baseline's, with bytecode cached outside both trees."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="art_hydra_bench_pyc_")
    env.pop("PYTHONPATH", None)
    sides = {"": env}
    if baseline is not None:
        old = dict(env, PYTHONPATH=os.path.abspath(baseline))
        old["PYTHONPYCACHEPREFIX"] = tempfile.mkdtemp(prefix="art_hydra_bench_pyc_")
        sides[" [baseline]"] = old
    return sides


def _runs(baseline: str | None) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Each measured command by its printed name: the bare import once, the rejections
    once per side."""
    runs = {}
    for side, env in _environments(baseline).items():
        for name, cmd in CASES.items():
            if side and cmd[1] == "-c":  # the reference cases run once, from this tree
                continue
            runs[name + side] = (cmd, env)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--baseline", help="another art_hydra checkout, run interleaved")
    args = parser.parse_args()
    env_cwd = tempfile.mkdtemp(prefix="art_hydra_bench_")
    runs = _runs(args.baseline)
    wall: dict[str, list[float]] = {name: [] for name in runs}
    cpu: dict[str, list[float]] = {name: [] for name in runs}
    for cmd, env in runs.values():  # warm the file and bytecode caches once
        run_once(cmd, env_cwd, env)
    for _ in range(args.repeats):
        for name, (cmd, env) in runs.items():
            took, used = run_once(cmd, env_cwd, env)
            wall[name].append(took)
            cpu[name].append(used)
    print(f"cpu cores: {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}")
    _report(cpu, args.repeats, "CPU time (user + system)")
    _report(wall, args.repeats, "wall time")


def _report(times: dict[str, list[float]], repeats: int, what: str) -> None:
    base = statistics.median(times["import hydra, omegaconf"])
    print(f"{what}, repeats: {repeats} (medians)")
    for name, samples in times.items():
        med = statistics.median(samples)
        print(f"{name:50s} {med * 1000:7.1f} ms   {med / base:5.2f}x the bare import")
    for name in CASES:
        old = times.get(name + " [baseline]")
        if old is not None:
            now = statistics.median(times[name]) / statistics.median(old)
            print(f"{name:50s} now / baseline = {now:.2f}x")
    refusal = statistics.median(times["art-hydra reject (validator)"])
    ratio = refusal / base
    verdict = "meets" if ratio <= 2.0 else "MISSES"
    print(f"rejection / bare import = {ratio:.2f}x ({verdict} the 2.0x target, {what})")
    plain = statistics.median(times["a plain Hydra app: compose a 1-line config"])
    print(f"a plain Hydra app composing a one-line config / bare import = {plain / base:.2f}x")
    layer = statistics.median(times["import art_hydra.conf"])
    composed = statistics.median(times["Hydra alone: compose, no checks"])
    print(
        f"the refusal's parts, in bare imports: hydra and omegaconf imported 1.00, art_hydra's "
        f"config layer imported {(layer - base) / base:.2f}, Hydra's composition "
        f"{(composed - layer) / base:.2f}, art_hydra's checks and report "
        f"{(refusal - composed) / base:.2f}\n"
    )


if __name__ == "__main__":
    main()
