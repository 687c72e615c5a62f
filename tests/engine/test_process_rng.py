"""The process-wide random states a checkpoint holds: torch's, Python's ``random`` and
NumPy's global generator, stored as tensors in safetensors (nothing pickled), so a reward
that draws from any of them continues its stream after a resume; a checkpoint written
before Python's and NumPy's states were saved still loads."""

from __future__ import annotations

import random
from pathlib import Path

import numpy
import torch
from safetensors.torch import load_file, save_file

from art_hydra.runs.checkpoint import _process_rng, _restore_process_rng


def _draws() -> tuple:
    return (
        random.random(),
        random.gauss(0.0, 1.0),
        float(numpy.random.random()),
        float(numpy.random.standard_normal()),
        torch.rand(3).tolist(),
    )


def test_every_generator_continues_its_stream_through_a_saved_file(tmp_path: Path) -> None:
    random.seed(1)
    numpy.random.seed(2)
    torch.manual_seed(3)
    random.gauss(0.0, 1.0)  # a cached second Gaussian is part of each state
    numpy.random.standard_normal()
    save_file(_process_rng(), tmp_path / "rng.safetensors")
    expected = _draws()
    random.seed(9)
    numpy.random.seed(9)
    torch.manual_seed(9)
    _restore_process_rng(load_file(tmp_path / "rng.safetensors"))
    assert _draws() == expected


def test_a_checkpoint_without_python_and_numpy_states_still_loads(tmp_path: Path) -> None:
    """Older checkpoints saved torch's state only: it is restored, the others are left
    as seeded (what resuming did then)."""
    torch.manual_seed(3)
    old = {"torch_cpu": _process_rng()["torch_cpu"]}
    save_file(old, tmp_path / "rng.safetensors")
    expected_torch = torch.rand(3).tolist()
    random.seed(5)
    numpy.random.seed(5)
    seeded = (random.random(), float(numpy.random.random()))
    random.seed(5)
    numpy.random.seed(5)
    _restore_process_rng(load_file(tmp_path / "rng.safetensors"))
    assert torch.rand(3).tolist() == expected_torch
    assert (random.random(), float(numpy.random.random())) == seeded
