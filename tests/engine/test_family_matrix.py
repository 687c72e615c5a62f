"""The family sample the model and slow tiers train (tests/family_matrix.py): whatever
the seed, it holds a member of every behaviour class, in every universe a module
samples; every family belongs to a class, so each gets its turn; the full matrix is
every family."""

from __future__ import annotations

import pytest
from family_matrix import FULL, SEED, sample
from family_models import CLASSES, FAMILIES, HYBRIDS, MATRIX, family_params

SEEDS = ["2026-12-07", "2026-12-08", "x", "0"]


def test_every_family_is_in_a_class_of_the_matrix() -> None:
    assert set().union(*CLASSES.values()) == set(FAMILIES)


@pytest.mark.parametrize("seed", SEEDS)
def test_every_class_has_a_member_in_every_sample(
    monkeypatch: pytest.MonkeyPatch, seed: str
) -> None:
    monkeypatch.delenv(FULL, raising=False)
    monkeypatch.setenv(SEED, seed)
    matrix = sample(CLASSES, FAMILIES)
    assert len(matrix) < len(FAMILIES) and sample(CLASSES, FAMILIES, matrix, extra=0) == matrix
    for universe in (FAMILIES, HYBRIDS):
        picked = set(sample(CLASSES, universe, matrix, extra=0))
        assert picked >= set(matrix) & set(universe)  # the same families, the same folders
        for cls, members in CLASSES.items():
            assert not members & set(universe) or picked & members, (seed, cls)


def test_the_samples_rotate_through_every_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(FULL, raising=False)
    seen: set[str] = set()
    for day in range(60):  # every family within two months of daily runs
        monkeypatch.setenv(SEED, f"day {day}")
        seen |= set(sample(CLASSES, FAMILIES))
    assert seen == set(FAMILIES)


def test_the_full_matrix_is_every_family(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FULL, "1")
    assert sample(CLASSES, FAMILIES, MATRIX) == sorted(FAMILIES)
    names = [getattr(p, "values", [p])[0] for p in family_params(HYBRIDS)]
    assert names == sorted(HYBRIDS)
