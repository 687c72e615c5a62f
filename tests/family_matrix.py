"""Which model families a run of the suite trains: a rotating sample that always holds a
member of every behaviour class, or (``ART_HYDRA_FULL_MATRIX=1``, ``make test-full``)
all of them.

Each family builds and runs a model of its own; the whole matrix would be most of the
model and slow tiers' time. A class is a way a family can break the layout, the cache
copy or the chunked head (a binding window, a recurrent state, a tied head, experts,
...): every run proves each class on one of its members, and as the seed changes (the
UTC date, or ``ART_HYDRA_MATRIX_SEED``) every member gets its turn. Pure Python (no
torch), so the Makefile can print the sample before the tiers run.
"""

from __future__ import annotations

import datetime
import os
import random
from collections.abc import Iterable, Mapping

#: Set to 1 (``make test-full``) to run every family.
FULL = "ART_HYDRA_FULL_MATRIX"
#: Names the sample; the UTC date when unset (the Makefile sets it once for both tiers'
#: processes, so xdist workers started around midnight agree).
SEED = "ART_HYDRA_MATRIX_SEED"
#: Families drawn beyond the classes' representatives: a family that shares every class
#: with others (a plain packing family) still gets its turn: every family within 45 days
#: of daily seeds.
EXTRA = 2


def full_matrix() -> bool:
    return os.environ.get(FULL, "").strip().lower() in {"1", "true", "yes"}


def seed() -> str:
    return os.environ.get(SEED) or datetime.datetime.now(datetime.timezone.utc).date().isoformat()


def sample(
    classes: Mapping[str, Iterable[str]],
    universe: Iterable[str],
    chosen: Iterable[str] = (),
    extra: int = EXTRA,
) -> list[str]:
    """``universe`` cut to one member of each class that has one in it, plus ``extra``
    more (all of it under ``ART_HYDRA_FULL_MATRIX=1``): the members of ``chosen`` first
    (so modules sampling other universes reuse the same families and their folders),
    then, class by class in an order the seed shuffles, one drawn by the seed."""
    names = sorted(set(universe))
    if full_matrix():
        return names
    rng = random.Random(seed())
    picked = set(chosen) & set(names)
    order = sorted(classes)
    rng.shuffle(order)
    for cls in order:
        members = sorted(set(classes[cls]) & set(names))
        if members and not picked & set(members):
            picked.add(rng.choice(members))
    rest = sorted(set(names) - picked)
    picked.update(rng.sample(rest, min(extra, len(rest))))
    return sorted(picked)


def describe(picked: Iterable[str], universe: Iterable[str]) -> str:
    """The line the Makefile prints: which families run, from which seed, and how to run
    them all."""
    picked, names = sorted(picked), sorted(set(universe))
    if full_matrix():
        return f"family matrix: all {len(names)} families ({FULL}=1)"
    return (
        f"family matrix: {len(picked)} of {len(names)} families ({SEED}={seed()}; "
        f"`make test-full` or {FULL}=1 runs all): {', '.join(picked)}"
    )
