"""Shared helpers: run the real CLI in a subprocess, from a scratch working directory;
read Problems and printed reports; give every test its tier (fast, model, slow, dist)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

#: The installed console script next to this interpreter (pip install -e '.[dev]').
ART_HYDRA = str(Path(sys.executable).with_name("art-hydra"))

CliRunner = Callable[..., subprocess.CompletedProcess]

#: The tiers, each naming what its tests need (pyproject.toml [tool.pytest.ini_options]
#: describes them); every test belongs to exactly one.
TIERS = ("fast", "model", "slow", "dist")
#: A test without a tier mark of its own takes its folder's.
FOLDER_TIERS = {
    "config": "fast",
    "preflight": "fast",
    "commands": "fast",
    "sweeps": "fast",
    "runs": "fast",
    "trackers": "fast",
    "reliability": "fast",
    "engine": "model",
    "tasks": "model",
    "distributed": "dist",
    "unsloth_stage": "slow",
    "vllm_stage": "slow",
}


def tier_of(item: pytest.Item) -> str:
    """The one tier of ``item``: its own (or its module's) tier mark, else its folder's."""
    marked = {mark.name for mark in item.iter_markers() if mark.name in TIERS}
    if len(marked) > 1:
        raise pytest.UsageError(f"{item.nodeid} has several tiers: {sorted(marked)}")
    if marked:
        return marked.pop()
    here = Path(__file__).parent
    path = Path(str(item.path))
    folder = path.relative_to(here).parts[0] if path.is_relative_to(here) else str(path)
    if folder not in FOLDER_TIERS:
        raise pytest.UsageError(f"{item.nodeid}: no tier mark and no tier for tests/{folder}")
    return FOLDER_TIERS[folder]


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads its options
def pytest_configure(config: pytest.Config) -> None:
    """``pytest -m fast`` spreads over every core when pytest-xdist is installed: the
    tier is mostly CLI subprocesses, independent of each other (``-n 0`` keeps one
    process; any ``-n`` given wins). Other tiers run in one process: training tests
    would take turns on the same cores and their signal tests time steps."""
    if config.getoption("markexpr", "") != "fast" or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if not config.pluginmanager.hasplugin("xdist") or config.getoption("numprocesses", None):
        return
    if config.getoption("numprocesses", None) == 0 or config.getoption("collectonly"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if (cores or 1) > 1:
        config.option.numprocesses = cores
        config.option.tx = ["popen"] * cores
        config.option.dist = "load"


@pytest.hookimpl(tryfirst=True)  # before -m deselects by mark
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its tier, so ``pytest -m fast`` (or model, slow, dist) selects it."""
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(tier)


def problem_about(problems: Any, key: str) -> Any:
    """The one :class:`~art_hydra.config.problems.Problem` about ``key`` in ``problems``
    (a list, or the ConfigValidationError that carries them): tests read its fields
    (key, kind, severity, fix), not the wording of the report, unless wording is the point."""
    found = [p for p in getattr(problems, "problems", problems) if p.key == key]
    assert len(found) == 1, f"{len(found)} problems about {key}: {found}"
    return found[0]


#: A report entry's first line: ``  1. key = value``.
_ENTRY = re.compile(r"^  \d+\. (?P<key>\S+) = (?P<value>.*)$")


def report_entries(out: str) -> list[tuple[str, str, str]]:
    """The entries of a printed report as (key, value, fix) in order, so that CLI tests
    read the report's structure rather than the wording of its reasons."""
    entries: list[list[str]] = []
    for line in out.splitlines():
        found = _ENTRY.match(line)
        if found:
            entries.append([found["key"], found["value"], ""])
        elif entries and line.startswith("     fix: "):
            entries[-1][2] = line.removeprefix("     fix: ")
    return [(key, value, fix) for key, value, fix in entries]


def _cli_env(env: dict[str, str] | None) -> dict[str, str]:
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update(env or {})
    return full_env


#: Set to 1 to run every CLI call as a fresh subprocess (to compare against the zygote).
ALWAYS_FRESH = os.environ.get("ART_HYDRA_TESTS_FRESH") == "1"
_zygote: list[Any] = []  # this worker's CLI zygote (tests/cli_zygote.py), once started
#: The environment this worker started with, before any test changed it: the zygote's.
_START_ENV = _cli_env(None)


def _cli_zygote() -> Any:
    """This worker's zygote, started on first use with the worker's own starting
    environment (a command whose environment would start an interpreter differently
    runs fresh instead)."""
    import tempfile

    from cli_zygote import Zygote

    if not _zygote:
        _zygote.append(Zygote(ART_HYDRA, _START_ENV))
        _zygote.append(tempfile.mkdtemp(prefix="art-hydra-cli-"))
    return _zygote[0]


def _stop_zygote() -> None:
    if _zygote:
        import shutil

        _zygote[0].close()
        shutil.rmtree(_zygote[1], ignore_errors=True)
        _zygote.clear()


def pytest_sessionfinish(session: pytest.Session) -> None:
    _stop_zygote()


def run_cli(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    module: bool = False,
    fresh: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run ``art-hydra ARGS`` (or ``python -m art_hydra ARGS``) and capture its output.

    The command runs in a child forked from this worker's CLI zygote
    (tests/cli_zygote.py): its own process, working folder, environment and output,
    without an interpreter start and the imports. ``fresh=True`` (and ``module=True``, or
    an ``env`` that changes ``PYTHON*`` or locale variables) runs a new interpreter
    instead, for tests about what happens when a process starts: which modules it
    imports, the console script itself, variables read at start."""
    full_env = _cli_env(env)
    from cli_zygote import starts_differently

    if not (module or fresh or ALWAYS_FRESH):
        zygote = _cli_zygote()
        if not starts_differently(full_env, zygote.env):
            try:
                return zygote.run(
                    list(args), cwd=str(cwd), env=full_env, timeout=timeout, scratch=_zygote[1]
                )
            except subprocess.TimeoutExpired:
                raise
            except BaseException:  # interrupted mid-command: the next call starts anew
                _stop_zygote()
                raise
    cmd = [sys.executable, "-m", "art_hydra", *args] if module else [ART_HYDRA, *args]
    return subprocess.run(
        cmd, cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def cli(tmp_path: Path) -> CliRunner:
    """``cli(*args)`` runs the CLI with ``tmp_path`` as working directory."""

    def runner(*args: str, **kwargs) -> subprocess.CompletedProcess:
        kwargs.setdefault("cwd", tmp_path)
        return run_cli(*args, **kwargs)

    return runner


def output_of(proc: subprocess.CompletedProcess) -> str:
    return proc.stdout + proc.stderr


def start_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``art-hydra ARGS`` in its own session, so signals reach it as they would
    from a terminal (a background job started by a non-interactive shell ignores
    SIGINT, and Python keeps it ignored)."""
    full_env = _cli_env(env)
    return subprocess.Popen(
        [ART_HYDRA, *args],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def two_ranks_by_hand(*args: str, cwd: Path) -> list[subprocess.Popen]:
    """``art-hydra ARGS`` as two ranks started by hand, as a cluster's scheduler starts
    tasks (each gets its own signals; no torchrun agent in between)."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    return [
        start_cli(
            *args,
            cwd=cwd,
            env={
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": port,
            },
        )
        for rank in (0, 1)
    ]


def wait_for_steps(run_dir: Path, steps: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Wait until the run has logged ``steps`` steps (its metrics file has the lines)."""
    import time

    deadline = time.monotonic() + timeout
    metrics = run_dir / "metrics.jsonl"
    while time.monotonic() < deadline:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= steps:
            return
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early:\n{proc.communicate()[1]}")
        time.sleep(0.02)
    raise AssertionError(f"no {steps} steps within {timeout}s")


def shared_config_dir(tmp_path: Path, files: dict[str, str]) -> Path:
    """A config folder someone handed the user (``tmp_path/shared``), holding ``files``
    (relative path -> YAML text)."""
    shared = tmp_path / "shared"
    for name, text in files.items():
        path = shared / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return shared


def write_model_files(folder: Path, config: dict[str, Any]) -> Path:
    """The smallest folder the model pre-flight accepts, written without torch: ``config``
    as config.json, a safetensors file with no tensors, and a character tokenizer with an
    EOS (tests that need real weights build a family model, tests/family_models.py)."""
    import json
    import string
    import struct

    from tokenizers import Regex, Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 2) + b"{}")
    vocab = {token: i for i, token in enumerate(["<pad>", "<eos>", "<unk>", *string.printable])}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": "<eos>", "pad_token": "<pad>", "unk_token": "<unk>"})
    )
    return folder


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny llama folder whose heads vLLM's CPU kernel runs, for the whole vLLM stage
    (every run reads it, none writes it): tests/vllm_folders.py."""
    from vllm_folders import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))
