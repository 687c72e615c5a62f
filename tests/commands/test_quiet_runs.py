"""A clean run prints no library warnings, and a clean report ends without Hydra's hint."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import output_of

pytestmark = pytest.mark.slow

SHORT = [
    "trainer.max_steps=2",
    "trainer.per_device_train_batch_size=16",
    "logging.progress_bar=off",
    "logging.plot=false",
]


@pytest.mark.parametrize("extra", [[], ["model.finetune=lora"]], ids=["full", "lora"])
def test_default_and_lora_runs_print_no_warning(cli, tmp_path: Path, extra: list[str]) -> None:
    proc = cli(*SHORT, *extra, env={"PYTHONWARNINGS": "default"})
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "Warning" not in out, out


def test_a_refused_second_run_ends_without_hydras_hint(cli, tmp_path: Path) -> None:
    """The folder already holds a run: refused by the world pre-flight, cleanly."""
    first = cli(*SHORT, "hydra.run.dir=run")
    assert first.returncode == 0, output_of(first)
    proc = cli(*SHORT, "hydra.run.dir=run")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "already holds a run" in out
    assert "HYDRA_FULL_ERROR" not in out and "Traceback" not in out
