"""Importing any module of the package starts nothing: ``art_hydra.__main__`` runs the
command only as ``python -m art_hydra`` (a tool that walks the package's modules, a
documentation builder or a test collector must not train)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

WALK = """
import importlib, pkgutil, sys
import art_hydra

names = [m.name for m in pkgutil.walk_packages(art_hydra.__path__, "art_hydra.")]
assert "art_hydra.__main__" in names, names
for name in names:
    importlib.import_module(name)
print("imported", len(names), "modules")
"""


def test_importing_every_module_starts_no_run_and_writes_nothing(tmp_path: Path) -> None:
    # argv as a command line would give it: a module that ran main() would start a run.
    proc = subprocess.run(
        [sys.executable, "-c", WALK, "trainer.max_steps=1", "hydra.run.dir=would_train"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "imported" in proc.stdout
    assert "steps, final" not in proc.stdout + proc.stderr
    assert list(tmp_path.iterdir()) == []  # no run folder, no outputs/, no log


def test_python_dash_m_still_runs_the_command(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "art_hydra", "dry_run=true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "dry run: the configuration is valid" in proc.stdout
