"""Default runs stay bit-for-bit what they were: every metric and the final weights.

``golden/runs.json`` was written by ``golden/record.py`` with the code as it was before
family-aware packing, untruncated logprobs and optimizer parameter groups. With default
settings none of those may change a single bit. Bitwise equality only means something
on the torch build and CPU capability it was recorded on, so elsewhere the test skips.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

#: These tests train the tiny model.
pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parent / "golden"


def _record_module() -> ModuleType:
    """``golden/record.py`` itself, so the test re-runs exactly what was recorded."""
    spec = importlib.util.spec_from_file_location("golden_record", GOLDEN / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD = _record_module()
RECORDED = json.loads((GOLDEN / "runs.json").read_text())


@pytest.mark.parametrize("name", sorted(RECORD.RUNS))
def test_default_runs_are_bit_for_bit_unchanged(name: str) -> None:
    here = RECORD.fingerprint()
    if here != RECORDED["fingerprint"]:
        pytest.skip(f"recorded on {RECORDED['fingerprint']}, this machine is {here}")
    assert RECORDED["common"] == RECORD.COMMON
    expected = RECORDED["runs"][name]
    assert RECORD.RUNS[name] == expected["overrides"]
    got = RECORD.run(name, RECORD.RUNS[name])
    assert len(got["metrics"]) == len(expected["metrics"])
    for step, (now, then) in enumerate(zip(got["metrics"], expected["metrics"], strict=True)):
        for key, value in then.items():
            assert now[key] == value, (name, step + 1, key, now[key], value)
    assert got["weights_sha256"] == expected["weights_sha256"]
