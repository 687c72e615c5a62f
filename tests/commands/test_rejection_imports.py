"""A refused config is reported without importing what only a run or a sweep needs
(issue 39): the run's way in (``art_hydra.run``, the job record), Hydra's job launch
and the sweep plugins' registration load on first use, so the command's check pays
for composing, checking and the world pre-flight alone. ``import art_hydra`` still
offers ``train`` and the task markers."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

#: Modules a refusal of a single run never needs.
NOT_FOR_A_REFUSAL = (
    "art_hydra.run",
    "art_hydra.commands.launch",
    "art_hydra.engine.result",
    "art_hydra.runs.progress",
    "torch",
    "transformers",
)

SCRIPT = """
import json, sys
sys.argv = ["art-hydra", *sys.argv[1:]]
from art_hydra.commands.cli import main
try:
    main()
except SystemExit as exc:
    code = exc.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _refused(tmp_path: Path, *overrides: str) -> dict:
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, *overrides],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "The configuration cannot run" in proc.stderr, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_refused_config_imports_neither_the_run_nor_the_launch(tmp_path: Path) -> None:
    found = _refused(tmp_path, "trainer.gradient_accumulation_steps=2", "algorithm=foo")
    assert found["code"] == 1
    loaded = [m for m in NOT_FOR_A_REFUSAL if m in found["modules"]]
    assert loaded == [], loaded


def test_the_package_still_offers_train_and_the_markers() -> None:
    import art_hydra
    from art_hydra.run import train
    from art_hydra.tasks.markers import environment, generator, reward, tool

    assert art_hydra.train is train
    assert (art_hydra.reward, art_hydra.generator) == (reward, generator)
    assert (art_hydra.environment, art_hydra.tool) == (environment, tool)
    assert all(hasattr(art_hydra, name) for name in art_hydra.__all__)
    with pytest.raises(AttributeError):
        art_hydra.no_such_name  # noqa: B018
