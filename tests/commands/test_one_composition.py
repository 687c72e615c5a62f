"""A single run started by the command is composed once and checked once: the checked
composition is what Hydra runs as the job (no composition in Hydra, no check again in
the job, no cache that hides a repeat). A sweep's job and a Python caller of ``train``
check their own config, once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.plugin_packages import run_launcher

#: Counts, in the user's launcher process, every composition (ours and Hydra's own
#: loader), every check of a config alone, and every world pre-flight of the task, model
#: and backend (the one that streams the data file and dry-calls the rewards).
COUNTING = """
import atexit, json, os
from collections import Counter

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from art_hydra.config import composition, hydra_compat
import art_hydra.preflight.runner as preflight
import art_hydra.run as run

counts = Counter()


def counted(owner, name, what):
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        counts[what] += 1
        return original(*args, **kwargs)

    setattr(owner, name, wrapper)


counted(hydra_compat._CachingLoaderMixin, "load_configuration", "compositions")
counted(ConfigLoaderImpl, "load_configuration", "compositions")
counted(composition, "check", "config_checks")
counted(run, "check", "job_checks")  # train()'s own check (run.py imported it by name)
counted(preflight, "environment_problems", "world_checks")
atexit.register(lambda: open(os.environ["COUNTS"], "w").write(json.dumps(counts)))
"""

SHORT = ["trainer.max_steps=1", "logging.progress_bar=off", "backend.cpu_threads=1"]


def _counts(tmp_path: Path, *overrides: str, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.setenv("COUNTS", str(tmp_path / "counts.json"))
    proc = run_launcher(tmp_path, "counting", COUNTING, *overrides)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return json.loads((tmp_path / "counts.json").read_text())


@pytest.mark.slow
def test_a_single_run_composes_once_and_checks_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counts = _counts(tmp_path, *SHORT, "hydra.run.dir=run", monkeypatch=monkeypatch)
    assert counts == {"compositions": 1, "config_checks": 1, "world_checks": 1}, counts
    assert (tmp_path / "run" / "metrics.jsonl").is_file()  # and that composition trained
    # Hydra's own record of the job, from that same composition.
    overrides = (tmp_path / "run" / ".hydra" / "overrides.yaml").read_text()
    assert "trainer.max_steps=1" in overrides
    assert "mode: RUN" in (tmp_path / "run" / ".hydra" / "hydra.yaml").read_text()


@pytest.mark.slow
def test_a_sweep_job_checks_its_own_config_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One point, basic launcher (in the same process): the sweep composes its master and
    the point, and the pre-flight checks the point before it starts; the job checks its
    config once more, as it would on another machine."""
    sweep = ["-m", *SHORT, "seed=1", "hydra.sweep.dir=sweep"]
    counts = _counts(tmp_path, *sweep, monkeypatch=monkeypatch)
    assert (tmp_path / "sweep" / "0" / "metrics.jsonl").is_file()
    # The job checks its config once; the world pre-flight ran for the point before the
    # sweep started and once in the job: two, never three.
    assert counts["job_checks"] == 1 and counts["world_checks"] == 2, counts
