"""The non-editable wheel ships conf/ and works from any directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def tracked_files(repo: Path) -> list[str]:
    """The repository's tracked files as they are in the working tree (edits included,
    deleted ones left out): what a fresh clone holds, never a virtual environment
    (.venv-unsloth alone is 3 GB once the Unsloth stage has run) or build outputs."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [name for name in listed.split("\0") if name and (repo / name).is_file()]


def copy_tracked(repo: Path, dest: Path) -> None:
    """Copy ``repo``'s tracked files (only those) into ``dest``."""
    for name in tracked_files(repo):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(repo / name, target)


@pytest.mark.slow  # builds a wheel and installs it into a fresh environment
def test_wheel_installs_and_runs_from_another_directory(tmp_path: Path) -> None:
    if not (REPO / ".git").exists():
        pytest.skip("builds from the tracked files of a git checkout")
    src = tmp_path / "src"
    copy_tracked(REPO, src)
    dist = tmp_path / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--no-build-isolation",
            "-w",
            str(dist),
            str(src),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    (wheel,) = dist.glob("art_hydra-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for needed in (
        "art_hydra/conf/__init__.py",
        "art_hydra/conf/config.yaml",
        "art_hydra/conf/model/tiny.yaml",
        "art_hydra/conf/experiment/tiny_sft_reverse.yaml",
        "art_hydra/config/run_config.schema.json",  # the editor schema (art-hydra --schema)
        "hydra_plugins/art_hydra_preflight/preflight_sweeper.py",
        "hydra_plugins/art_hydra_preflight/preflight_launcher.py",
        # The plugins' work, which the plugin classes delegate to.
        "art_hydra/sweeps/plugins.py",
        "art_hydra/sweeps/grid.py",
        "art_hydra/sweeps/launching.py",
        "art_hydra/sweeps/search_space.py",
        "art_hydra/sweeps/points.py",
        "art_hydra/sweeps/reports.py",
    ):
        assert needed in names, f"{needed} missing from the wheel"
    assert "hydra_plugins/__init__.py" not in names  # must stay a namespace package

    # A fresh environment that sees this one's dependencies but not its editable install.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    vpy = venv / "bin" / "python"
    site = subprocess.run(
        [vpy, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    Path(site, "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(vpy),
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        check=True,
        capture_output=True,
        text=True,
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "HYDRA_FULL_ERROR"}}
    where = subprocess.run(
        [
            vpy,
            "-c",
            "import art_hydra, art_hydra.conf; "
            "print(art_hydra.__file__); print(art_hydra.conf.__file__)",
        ],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    assert all(line.startswith(site) for line in where.stdout.split()), where.stdout

    ok = subprocess.run(
        [venv / "bin" / "art-hydra", "dry_run=true"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "name: tiny-llama" in ok.stdout

    bad = subprocess.run(
        [vpy, "-m", "art_hydra", "-m", "trainer.gradient_accumulation_steps=1,2"],
        cwd=elsewhere,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert "Point #1: trainer.gradient_accumulation_steps=2" in bad.stderr + bad.stdout
    assert not (elsewhere / "outputs").exists()
