"""A user's extension the two ways art_hydra takes it, for the registries' tests: a
launcher script that imports the user's module (which registers something) and then
calls ``art_hydra.commands.cli.main()``, and an installed package that contributes through an
entry point."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

PYPROJECT = """
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1"

[project.entry-points."{group}"]
{entries}
"""

#: The user's launcher: import the module that registers, then art_hydra's own CLI.
LAUNCHER = """import {module}
from art_hydra.commands.cli import main

if __name__ == "__main__":
    main()
"""


def run_launcher(
    tmp_path: Path, module: str, source: str, *overrides: str
) -> subprocess.CompletedProcess:
    """Write ``module.py`` (``source``) and a ``train.py`` that imports it and then runs
    art_hydra's CLI, and run ``train.py`` with ``overrides`` from ``tmp_path``."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    (tmp_path / "train.py").write_text(LAUNCHER.format(module=module))
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "WORLD_SIZE")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tmp_path), env.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "train.py", *overrides],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def install_package(
    tmp_path: Path, module: str, source: str, group: str, entries: str, name: str = ""
) -> Path:
    """Install a package holding ``module.py`` (``source``) whose ``entries`` (TOML lines
    ``key = "target"``) join the entry-point ``group``, into a folder of its own (no index,
    no dependencies); returns that folder, to put on PYTHONPATH."""
    src = tmp_path / "acme_src"
    src.mkdir()
    (src / f"{module}.py").write_text(textwrap.dedent(source))
    pyproject = PYPROJECT.format(
        name=name or module.replace("_", "-"), group=group, entries=entries
    )
    (src / "pyproject.toml").write_text(pyproject)
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index"]
    subprocess.run(
        [*pip, "--no-build-isolation", "--target", str(site), str(src)],
        check=True,
        capture_output=True,
        text=True,
    )
    return site


def with_site(site: Path) -> dict[str, str]:
    """The environment change that makes an installed package importable."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    }
