"""A check's verdict is remembered by exactly the config values it read: a change to any
of them runs it again, a change elsewhere does not, and a check that writes into the
config or reads a copy of it is never remembered (:mod:`art_hydra.sweeps.read_trace`)."""

from __future__ import annotations

import copy
import enum
import functools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Optional

import pytest
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from art_hydra.config.problems import Kind, Problem, fix
from art_hydra.sweeps.read_trace import Memo, Tree


def _cfg() -> DictConfig:
    return OmegaConf.create(
        {
            "a": {"x": 1, "y": 2.0, "flag": False},
            "b": {"items": [1, 2, {"deep": 3}], "ref": "${a.x}"},
            "c": None,
        }
    )


class _Counted:
    """A check and the number of times it really ran."""

    def __init__(self, fn: Any) -> None:
        self.fn, self.runs = fn, 0

    def __call__(self, cfg: DictConfig) -> list[Any]:
        self.runs += 1
        return list(self.fn(cfg))


def _point(memo: Memo, cfg: DictConfig, check: _Counted, **values: Any) -> list[Any]:
    """Set ``values`` (dotted keys with ``__``), run ``check`` remembered, put them back."""
    saved = {k: OmegaConf.select(cfg, k.replace("__", ".")) for k in values}
    for key, value in values.items():
        OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
    memo.begin()
    try:
        return memo.call("check", lambda: check(cfg))
    finally:
        memo.end()
        for key, value in saved.items():
            OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)


def test_a_check_runs_again_only_when_a_value_it_read_changes() -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [c.a.x * 10] if not c.a.flag else [c.a.y])
    assert _point(memo, cfg, check) == [10]
    assert _point(memo, cfg, check, a__y=5.0) == [10]  # y is not read while flag is false
    assert check.runs == 1
    assert _point(memo, cfg, check, a__x=3) == [30]
    assert _point(memo, cfg, check, a__flag=True) == [2.0]  # the other branch reads y
    assert _point(memo, cfg, check, a__flag=True, a__y=7.0) == [7.0]
    assert _point(memo, cfg, check, a__flag=True, a__x=9) == [2.0]
    assert check.runs == 4
    assert _point(memo, cfg, check, a__x=3) == [30]  # seen before
    assert check.runs == 4


def test_interpolations_lists_and_whole_sections_count_as_reads() -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))
    via_ref = _Counted(lambda c: [c.b.ref])
    assert _point(memo, cfg, via_ref) == [1]
    assert _point(memo, cfg, via_ref, a__x=4) == [4]  # read through the interpolation
    listed = _Counted(lambda c: [sum(i for i in c.b["items"] if isinstance(i, int))])
    memo.kept.clear()
    assert _point(memo, cfg, listed) == [3]
    cfg.b["items"][2].deep = 4  # a change inside the list, never read through _get_node
    assert _point(memo, cfg, listed) == [3] and listed.runs == 2  # the list is one leaf
    whole = _Counted(lambda c: [OmegaConf.to_container(c.a)["y"]])
    memo.kept.clear()
    assert _point(memo, cfg, whole) == [2.0]
    assert _point(memo, cfg, whole, a__y=6.0) == [6.0]


def test_a_check_that_writes_is_never_remembered() -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))

    def writes(c: DictConfig) -> list[Any]:
        c.a.y = c.a.y  # same value: a write all the same
        return [c.a.x]

    writer = _Counted(writes)
    assert _point(memo, cfg, writer) == [1]
    assert _point(memo, cfg, writer) == [1]
    assert writer.runs == 2
    assert "check" in memo.never


@pytest.mark.parametrize(
    ("copy_of", "exact"),
    [
        (copy.deepcopy, True),
        (lambda a: copy.deepcopy(copy.deepcopy(a)), True),
        # Merging into the copy, and filling a new config, read each key of the copy.
        (lambda a: OmegaConf.merge(a, {"y": 0.5}), False),  # a write into the copy only
        (lambda a: OmegaConf.create(a), False),
    ],
)
def test_a_read_of_a_sections_copy_is_a_read_of_the_section(copy_of: Any, exact: bool) -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))
    copier = _Counted(lambda c: [copy_of(c.a).x])
    after = _Counted(lambda c: [c.b.ref])  # runs after the copier at each point

    def point(**values: Any) -> list[Any]:
        for key, value in values.items():
            OmegaConf.update(cfg, key.replace("__", "."), value, merge=False)
        memo.begin()
        try:
            return memo.call("copier", lambda: copier(cfg)) + memo.call("after", lambda: after(cfg))
        finally:
            memo.end()

    assert point() == [1, 1]
    assert point(a__y=9.0) == [1, 1]  # y was copied, never read
    assert point(a__x=4) == [4, 4]
    assert point(a__x=1, a__y=2.0) == [1, 1]
    assert (copier.runs, after.runs) == (2 if exact else 3, 2)
    assert not memo.never


def test_a_point_that_changes_the_shape_is_checked_for_real() -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [c.c])
    assert _point(memo, cfg, check) == [None]
    assert _point(memo, cfg, check, c={"k": 1}) == [{"k": 1}]
    assert _point(memo, cfg, check) == [None]
    assert check.runs == 2  # the first verdict stayed good; the new shape ran for real


@dataclass
class _Pair:
    x: int = 1
    y: int = 2


@dataclass
class _Pairs:
    p: _Pair = field(default_factory=_Pair)
    q: _Pair = field(default_factory=lambda: _Pair(x=10, y=20))


def _merged_into_copy(c: DictConfig) -> list[Any]:
    mine = copy.deepcopy(c)
    mine.p = OmegaConf.merge(mine.p, {"y": 0})  # a typed section is filled in place
    return [mine.p.x]


def _assigned_into_copy(c: DictConfig) -> list[Any]:
    mine = copy.deepcopy(c)
    before = mine.p.x
    mine.p = c.q  # read before from p, after from q
    return [before, mine.p.x]


@pytest.mark.parametrize("check", [_merged_into_copy, _assigned_into_copy])
def test_a_section_assigned_into_a_copy_reads_every_source(check: Any) -> None:
    cfg = OmegaConf.structured(_Pairs)
    memo = Memo(Tree(cfg))
    counted = _Counted(check)
    for px, qx in ((1, 10), (3, 10), (3, 30), (1, 10)):
        cfg.p.x, cfg.q.x = px, qx
        memo.begin()
        assert memo.call("check", lambda: counted(cfg)) == check(cfg)
        memo.end()
    assert counted.runs <= 3  # the first point again: remembered


@dataclass
class _Inner:
    b: int = 1


@dataclass
class _Typed:
    a: Optional[_Inner] = field(default_factory=_Inner)  # noqa: UP045 (OmegaConf's typing)
    other: _Inner = field(default_factory=lambda: _Inner(b=7))
    x: int = 0


@pytest.mark.parametrize("swap", [None, "???", "${other}"])
def test_a_section_set_to_none_missing_or_an_interpolation_is_a_new_shape(swap: Any) -> None:
    # OmegaConf keeps the section's node and swaps its content: the leaves under it, as
    # indexed, still read their old values.
    cfg = OmegaConf.structured(_Typed)
    memo = Memo(Tree(cfg))

    def read(c: DictConfig) -> list[Any]:
        return [OmegaConf.is_missing(c, "a") or (c.a.b if c.a is not None else None)]

    check = _Counted(read)
    assert _point(memo, cfg, check) == [1]
    cfg.a = swap
    memo.begin()
    assert memo.leaves is None
    assert memo.call("check", lambda: check(cfg)) == read(cfg)
    memo.end()
    cfg.a = _Inner(b=5)  # a new section where the old one was: its leaves are not the old ones
    memo.begin()
    assert memo.call("check", lambda: check(cfg)) == [5]
    memo.end()
    runs = check.runs
    cfg.a = _Inner(b=1)  # the first point's shape and values again: its verdict holds
    memo.begin()
    assert memo.call("check", lambda: check(cfg)) == [1]
    memo.end()
    assert check.runs == runs


@pytest.mark.parametrize(
    "show",
    [
        lambda c: f"{c.a}",
        lambda c: repr(c.a),
        lambda c: str(c),
        lambda c: format(c.b["items"], ""),
        lambda c: "{:}".format(c.a),  # noqa: UP032 (the format protocol itself)
    ],
)
def test_a_check_that_formats_a_section_reads_all_of_it(show: Any) -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [show(c)])
    for y in (2.0, 3.0, 2.0):
        cfg.a.y, cfg.b["items"][2].deep = y, int(y)
        memo.begin()
        assert memo.call("check", lambda: check(cfg)) == [show(cfg)]
        memo.end()
    assert check.runs == 2


def test_after_a_check_writes_at_a_point_nothing_more_is_remembered_there() -> None:
    cfg = OmegaConf.create({"n": 100, "steps": -1})
    memo = Memo(Tree(cfg))

    def sizer() -> list[Any]:  # a plugin check that sizes the run in place
        cfg.steps = cfg.n // 2
        return []

    def point(n: int) -> list[Any]:
        cfg.n, cfg.steps = n, -1
        memo.begin()
        verdict = memo.call("sizer", sizer) + memo.call("reader", lambda: [cfg.steps])
        memo.end()
        return verdict

    assert point(100) == [50]
    assert point(10) == [5]
    assert point(100) == [50]
    assert "reader" not in memo.kept


def test_a_read_from_a_worker_thread_counts_for_the_running_check() -> None:
    cfg = _cfg()
    memo = Memo(Tree(cfg))

    def with_a_worker(c: DictConfig) -> list[Any]:
        seen: list[Any] = []
        thread = threading.Thread(target=lambda: seen.append(c.a.y))  # the check's helper
        thread.start()
        thread.join()
        return [c.a.x, *seen]

    check = _Counted(with_a_worker)
    assert _point(memo, cfg, check) == [1, 2.0]
    assert _point(memo, cfg, check, a__y=9.0) == [1, 9.0]  # the worker's read was recorded
    assert _point(memo, cfg, check, b__ref="x") == [1, 2.0]  # unread: remembered
    assert check.runs == 2
    kept: list[Any] = []
    memo.kept.clear()
    memo.begin()
    memo.call("keeps", lambda: kept.append(cfg._get_node) or [])
    memo.end()
    assert kept[0]("a") is not None  # a patched method kept past its trace still works


@pytest.mark.parametrize(
    "copy_of",
    [
        copy.deepcopy,
        copy.copy,
        lambda c: c.copy(),
        lambda c: OmegaConf.merge(c, {}),
        lambda c: OmegaConf.create(c),
        lambda c: OmegaConf.create({"inner": c}).inner,
    ],
)
def test_a_check_that_reads_a_copy_of_the_whole_config_reads_all_of_it(copy_of: Any) -> None:
    # A copy of the root hangs from nothing: its reads are not the tree's, so the copy
    # itself must count as reading every leaf (a root leaf and a deep one alike).
    cfg = OmegaConf.create({"seed": 1, "a": {"x": 1, "deep": {"z": 5}}})
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [(lambda d: (d.seed, d.a.deep.z))(copy_of(c))])
    for seed, z in ((1, 5), (2, 5), (2, 6), (1, 5)):
        cfg.seed, cfg.a.deep.z = seed, z
        memo.begin()
        assert memo.call("check", lambda: check(cfg)) == [(seed, z)]
        memo.end()
    assert check.runs == 3  # the last point is the first again


def test_values_that_compare_equal_but_read_apart_are_not_one_key() -> None:
    cfg = OmegaConf.create({"v": 0.0, "ints": {1: "int key", "1": "str key"}})
    memo = Memo(Tree(cfg))
    shown = _Counted(lambda c: [f"{c.v}"])
    for value, text in ((0.0, "0.0"), (-0.0, "-0.0"), (0.0, "0.0")):
        cfg.v = value
        memo.begin()
        assert memo.call("check", lambda: shown(cfg)) == [text]
        memo.end()
    assert shown.runs == 2
    lists = [Tree(OmegaConf.create({"seq": [inner]})).base[("seq",)] for inner in ([], {})]
    assert lists[0] != lists[1]  # a list holding an empty list, or an empty dict
    for key, other in ((1, "1"), ("1", 1)):  # one key read, the other changed alongside
        by_key = _Counted(lambda c, key=key: [c.ints[key]])
        memo = Memo(Tree(cfg))
        for value in ("first", "changed", "changed"):
            cfg.ints[key], cfg.ints[other] = value, "unread " + value
            memo.begin()
            assert memo.call("check", functools.partial(by_key, cfg)) == [value]
            memo.end()
        assert by_key.runs == 2


def test_a_dotted_key_is_not_the_section_of_that_name() -> None:
    cfg = OmegaConf.create({"a.b": 1, "a": {"b": 2}})
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [c["a.b"]])
    for flat, nested in ((1, 2), (1, 3), (5, 3)):
        cfg["a.b"], cfg.a.b = flat, nested
        memo.begin()
        assert memo.call("check", lambda: check(cfg)) == [flat]
        memo.end()
    assert check.runs == 2


class _Colour(enum.Enum):
    RED = 1
    BLUE = 2


@dataclass
class _ByColour:
    weights: dict[_Colour, int] = field(default_factory=lambda: {_Colour.RED: 1, _Colour.BLUE: 2})


@pytest.mark.parametrize("read", [lambda c: c.weights.RED, lambda c: c.weights["RED"]])
def test_a_dict_with_enum_keys_read_by_name_is_keyed_by_the_member(read: Any) -> None:
    cfg = OmegaConf.structured(_ByColour)
    memo = Memo(Tree(cfg))
    check = _Counted(lambda c: [read(c)])
    for red, blue in ((1, 2), (1, 3), (4, 3)):
        cfg.weights[_Colour.RED], cfg.weights[_Colour.BLUE] = red, blue
        memo.begin()
        assert memo.call("check", lambda: check(cfg)) == [red]
        memo.end()
    assert check.runs == 2


def _half(cfg: DictConfig) -> Iterator[Problem]:
    yield Problem("seed", cfg.seed, "seen before the crash", fix(note="none"), Kind.plugin)
    raise RuntimeError("boom")


def _half_missing(cfg: DictConfig) -> Iterator[Problem]:
    yield Problem("seed", cfg.seed, "seen before the missing value", fix(note="-"), Kind.plugin)
    raise MissingMandatoryValue("x")


def test_what_a_check_yields_before_it_raises_is_kept_as_a_full_check_keeps_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from art_hydra.config import validator_registry
    from art_hydra.preflight import runner, world_check_registry
    from art_hydra.preflight.world_check_registry import WorldCheck
    from art_hydra.sweeps import remembered_checks

    cfg = OmegaConf.create({"seed": 3, "strict": False})
    validators = {"half": _half, "half_missing": _half_missing}
    # One registry lookup serves both ways (the sweep's runs through run_validators).
    monkeypatch.setattr(validator_registry, "registered_validators", lambda: validators)
    checks = {n: WorldCheck(n, f, ("seed",)) for n, f in validators.items()}
    monkeypatch.setattr(world_check_registry.REGISTRY, "entries", lambda: checks)
    full = _reasons(validator_registry.run_validators(cfg))
    world = _reasons(runner.environment_problems(cfg, False))
    assert "seen before the crash" in full and "seen before the missing value" in full
    assert "seen before the crash" in world
    memo = Memo(Tree(cfg))
    for _ in range(2):  # run, then remembered
        memo.begin()
        assert _reasons(remembered_checks.rule_problems(cfg, memo)) == full
        assert _reasons(remembered_checks.world_problems(cfg, memo, False, frozenset())) == world
        memo.end()


def _reasons(problems: list[Problem]) -> list[str]:
    return [p.reason for p in problems]
