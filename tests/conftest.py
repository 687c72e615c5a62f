"""Shared helpers: run the real CLI in a subprocess, from a scratch working directory."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

#: The installed console script next to this interpreter (pip install -e '.[dev]').
ART_HYDRA = str(Path(sys.executable).with_name("art-hydra"))

CliRunner = Callable[..., subprocess.CompletedProcess]


def run_cli(
    *args: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    module: bool = False,
    timeout: float = 120,
) -> subprocess.CompletedProcess:
    """Run ``art-hydra ARGS`` (or ``python -m art_hydra ARGS``) and capture its output."""
    full_env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    full_env.update(env or {})
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
