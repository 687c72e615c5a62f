"""Default runs keep their behaviour: the same samples, rewards and losses on any machine.

``golden/runs.json`` was written by ``golden/record.py`` (its docstring has the history).
Two kinds of things are compared:

- What no CPU can change, exactly, everywhere: per generation batch the SHA-256 of the
  sampled token ids, their count and total length, every reward; and the metrics computed
  in Python from those (reward mean and std, completion length) and from the schedule
  (learning rate). A silent behaviour change (another mask, loss, sampler or data order)
  moves these at once.
- What comes out of torch kernels (loss, grad norm, KL, entropy), within ``RTOL``. Two
  2-core machines that both report AVX512 (an Intel Xeon and an AMD EPYC) computed them
  1.5e-7 relative apart at most (6e-8 to 1.5e-7 on loss and grad norm over 5 steps, with
  any thread count; the samples and rewards were the same). ``RTOL`` = 2e-6 leaves a
  margin of 13x over that, and is still far below what a change of behaviour does to a
  loss (1e-3 and more); reordering a float sum on purpose moved them by up to 1.8e-6.

Only where the fingerprint names the exact CPU model, torch build and kernel path it was
recorded on are the floats and the final weights compared bit for bit as well.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

#: These tests train the tiny model.
pytestmark = pytest.mark.slow

GOLDEN = Path(__file__).resolve().parent / "golden"
#: Relative tolerance on kernel floats (see the module docstring for why).
RTOL = 2e-6
#: Absolute floor for values that are zero (KL on the first step).
ATOL = 1e-12


def _record_module() -> ModuleType:
    """``golden/record.py`` itself, so the test re-runs exactly what was recorded."""
    spec = importlib.util.spec_from_file_location("golden_record", GOLDEN / "record.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


RECORD = _record_module()
RECORDED = json.loads((GOLDEN / "runs.json").read_text())
_RUNS: dict[str, dict[str, Any]] = {}


def _run(name: str) -> dict[str, Any]:
    """The run ``name`` on this machine (once per session: both tests read it)."""
    if name not in _RUNS:
        assert RECORDED["common"] == RECORD.COMMON
        assert RECORD.RUNS[name] == RECORDED["runs"][name]["overrides"]
        _RUNS[name] = RECORD.run(name, RECORD.RUNS[name])
    return _RUNS[name]


@pytest.mark.parametrize("name", sorted(RECORD.RUNS))
def test_default_runs_sample_and_score_the_same_and_losses_agree(name: str) -> None:
    expected, got = RECORDED["runs"][name], _run(name)
    assert got["generations"] == expected["generations"], name
    assert len(got["metrics"]) == len(expected["metrics"])
    for now, then in zip(got["metrics"], expected["metrics"], strict=True):
        step = then["step"]
        assert now["step"] == step
        for key in RECORD.EXACT_METRICS:
            assert now[key] == then[key], (name, step, key, now[key], then[key])
        for key in RECORD.FLOAT_METRICS:
            close = math.isclose(now[key], then[key], rel_tol=RTOL, abs_tol=ATOL)
            assert close, (name, step, key, now[key], then[key], RTOL)


@pytest.mark.parametrize("name", sorted(RECORD.RUNS))
def test_default_runs_are_bit_for_bit_unchanged_on_the_recorded_machine(name: str) -> None:
    here = RECORD.fingerprint()
    if here != RECORDED["fingerprint"]:
        pytest.skip(f"bitwise only on {RECORDED['fingerprint']}; this machine is {here}")
    expected, got = RECORDED["runs"][name], _run(name)
    for now, then in zip(got["metrics"], expected["metrics"], strict=True):
        for key, value in then.items():
            assert now[key] == value, (name, then["step"], key, now[key], value)
    assert got["weights_sha256"] == expected["weights_sha256"]
