"""The sweep pre-flight's fast way gives each point the verdict full composition gives.

:class:`~art_hydra.sweeps.preflight.PointChecker` composes once per group selection and
checks a point by setting its values on the shared base; the tests draw random grids
(plain values, bad values, group choices, ``+``/``~`` overrides, ``${hydra:...}`` and
other interpolations, values a config file may not choose) and compare every point's
problems, field by field, with those of full composition as the job would compose it.
"""

from __future__ import annotations

import itertools
import random

import pytest
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.problems import Severity
from art_hydra.sweeps.points import sweep_hand
from art_hydra.sweeps.preflight import PointChecker

VALUES = [
    "trainer.learning_rate=1e-4",
    "trainer.learning_rate=3e-4",
    "trainer.learning_rate=abc",
    "trainer.learning_rate=1e-50",
    "rl.num_generations=1",
    "rl.num_generations=3",
    "rl.num_generations=4",
    "trainer.gradient_accumulation_steps=2",
    "seed=5",
    "rl.top_p=0.001",
    "rl.temperature=0.5",
    "rl.loss_type=cispo",
    "rl.loss_type=CISPO",
    "model.max_seq_length=16",
    "distributed.world_size=null",
    "checkpoint.dir=${hydra:job.num}",
    "checkpoint.dir=ck_${seed}",
    "checkpoint.dir=../out",
    "logging.every_steps=3",
    "strict=true",
    "+trainer.x=1",
    "~seed",
    "task.reward._target_=os.system",
    "trainer.max_steps=0",
    "trainer.bogus=1",
    "seed.x=1",
    "rl.nope.deep=1",
    "trainer=5",
    "rl.max_prompt_length=3",
    "eval.max_examples=2",
]
GROUPS = ["algorithm=sft", "task=digit_sum", "model=qwen2_5_0_5b_instruct", "backend=unsloth"]


def _master(sweep_dir: str, extra: list[str]) -> object:
    loader = make_loader()
    return loader, loader.load_configuration(
        "config", [f"hydra.sweep.dir={sweep_dir}", *extra], run_mode=RunMode.MULTIRUN
    )


def _fields(problems: list) -> list[tuple]:
    return [(p.key, str(p.value), p.reason, str(p.fix), p.kind, p.severity) for p in problems]


@pytest.mark.parametrize(
    ("seed", "master_extra"),
    [
        (1, []),
        (2, ["hydra.sweep.subdir=${hydra.job.override_dirname}"]),
        (3, ["strict=true"]),
        # Evaluation data of its own: the eval check reads it through a copy of the config.
        (4, ["task=jsonl", "task.path=DATA", "eval.path=DATA"]),
    ],
)
def test_random_points_get_the_verdict_of_full_composition(
    tmp_path, seed: int, master_extra: list[str]
) -> None:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(f'{{"prompt": "ab{i}=", "answer": "ba"}}\n' for i in range(8)))
    master_extra = [o.replace("DATA", str(data)) for o in master_extra]
    rng = random.Random(seed)
    loader, master = _master(str(tmp_path / "sweep"), master_extra)
    hand = sweep_hand(master)
    fast = PointChecker(loader, master, hand)
    full = PointChecker(loader, master, hand, fast_way=False)
    points = [
        rng.sample(VALUES, rng.randint(0, 3)) + rng.sample(GROUPS, rng.randint(0, 1))
        for _ in range(20)
    ]
    fixed = [o for o in master_extra if not o.startswith("hydra.")]
    for number, point in enumerate(points):
        rng.shuffle(point)
        point = [*fixed, *point]  # a sweeper gives every point the fixed task overrides
        expected = full.problems(point, number)
        assert _fields(fast.problems(point, number)) == _fields(expected), point
        assert fast.run_dirs.get(number) == full.run_dirs.get(number), point
    assert fast.fast >= 3  # the plain ones went the fast way


def test_a_grid_of_values_goes_the_fast_way_with_one_composition_per_group(tmp_path) -> None:
    loader, master = _master(str(tmp_path / "sweep"), [])
    checker = PointChecker(loader, master, sweep_hand(master))
    points = [
        [f"trainer.learning_rate={lr}", f"seed={s}", group]
        for lr in (1e-4, 3e-4)
        for s in range(5)
        for group in ("algorithm=rl", "algorithm=sft")
    ]
    verdicts = [checker.problems(p, i) for i, p in enumerate(points)]
    assert checker.fast == len(points)
    assert len(checker._bases) == 2  # one composition per distinct group choice
    assert not any(p.is_error for problems in verdicts for p in problems)


def test_points_that_would_share_a_folder_are_refused(tmp_path) -> None:
    loader, master = _master(str(tmp_path / "sweep"), ["hydra.sweep.subdir=s${seed}"])
    checker = PointChecker(loader, master, sweep_hand(master))
    first = checker.problems(["trainer.learning_rate=1e-3"], 0)
    second = checker.problems(["trainer.learning_rate=2e-3"], 1)
    assert not any(p.is_error for p in first)
    (shared,) = [p for p in second if p.is_error]
    assert shared.key == "hydra.sweep.subdir"
    assert shared.fix.overrides() == ["hydra.sweep.subdir=${hydra.job.num}"]
    assert "#0 and #1" in shared.reason


#: Values that decide the run's length (composition decides which key sizes it).
LENGTH = [
    "trainer.max_steps=null",
    "trainer.max_steps=64",
    "trainer.max_steps=0",
    "trainer.num_train_epochs=0.5",
    "trainer.num_train_epochs=null",
    "trainer.per_device_train_batch_size=4",
    "trainer.learning_rate=abc",
    "trainer.warmup_steps=40",
]


@pytest.mark.parametrize(("seed", "swept"), [(4, []), (5, ["trainer.num_train_epochs=1,2"])])
def test_random_length_points_get_the_verdict_of_full_composition(
    tmp_path, seed: int, swept: list[str]
) -> None:
    """Epochs or steps, typed by a point or swept (then typed in each job), on a model
    whose settings set trainer.max_steps: both ways decide the run's length alike."""
    rng = random.Random(seed)
    loader, master = _master(str(tmp_path / "sweep"), swept)
    hand = sweep_hand(master)
    fast = PointChecker(loader, master, hand)
    full = PointChecker(loader, master, hand, fast_way=False)
    for number in range(16):
        point = rng.sample(LENGTH, rng.randint(0, 3)) + rng.sample(GROUPS, rng.randint(0, 1))
        if swept:
            point = [p for p in point if "num_train_epochs" not in p]
            point.append(f"trainer.num_train_epochs={rng.choice([1, 2])}")
        rng.shuffle(point)
        expected = full.problems(point, number)
        assert _fields(fast.problems(point, number)) == _fields(expected), point
    assert fast.fast >= 3


def test_swept_epochs_set_a_files_max_steps_aside_the_fast_way_too(tmp_path) -> None:
    """Epochs the sweep varies are typed in each job: they set tiny.yaml's max_steps
    aside, a typed max_steps wins with the warning, and a batch too small to count
    gets its report, on both ways alike."""
    loader, master = _master(
        str(tmp_path / "sweep"), ["trainer.num_train_epochs=1,2", "trainer.max_steps=null,50"]
    )
    hand = sweep_hand(master)
    fast = PointChecker(loader, master, hand)
    full = PointChecker(loader, master, hand, fast_way=False)
    points = [
        ["trainer.num_train_epochs=1", "trainer.max_steps=null"],
        ["trainer.num_train_epochs=2", "trainer.max_steps=50"],
        ["trainer.num_train_epochs=2", "trainer.max_steps=null", "rl.steps_per_generation=3"],
        [
            "trainer.num_train_epochs=1",
            "trainer.max_steps=null",
            "trainer.per_device_train_batch_size=4",
        ],
        ["trainer.num_train_epochs=1", "trainer.max_steps=null"],
    ]
    verdicts = []
    for number, point in enumerate(points):
        expected = full.problems(point, number)
        assert _fields(fast.problems(point, number)) == _fields(expected), point
        verdicts.append(sorted(p.key for p in expected))
    assert fast.fast >= 3
    assert verdicts[0] == verdicts[4] == []
    assert verdicts[1] == ["trainer.num_train_epochs"]  # the typed max_steps wins: warned
    assert verdicts[3] == ["trainer.per_device_train_batch_size"]


def test_a_grid_checked_as_deltas_gets_the_full_verdict_at_every_point(tmp_path) -> None:
    """A grid whose points repeat the values each check reads (so most checks answer
    from what they read before), with refused values, a group change and seeds (the
    generated data follows the seed): every verdict is full composition's."""
    grid = {
        "trainer.learning_rate": ["1e-4", "1e-50"],
        "rl.temperature": ["0.7", "1.0"],
        "rl.top_p": ["1.0", "0.001"],
        "trainer.warmup_steps": ["1", "100000"],
        "seed": ["1", "2"],
        "algorithm": ["rl", "sft"],
    }
    swept = [f"{key}={','.join(values)}" for key, values in grid.items()]
    loader, master = _master(str(tmp_path / "sweep"), swept)
    hand = sweep_hand(master)
    fast = PointChecker(loader, master, hand)
    full = PointChecker(loader, master, hand, fast_way=False)
    points = [
        [f"{key}={value}" for key, value in zip(grid, chosen, strict=True)]
        for chosen in itertools.product(*grid.values())
    ]
    refused = 0
    for number, point in enumerate(random.Random(6).sample(points, 24)):
        expected = full.problems(point, number)
        assert _fields(fast.problems(point, number)) == _fields(expected), point
        refused += any(p.is_error for p in expected)
    memo_hits = sum(base.memo.hits for base in fast._bases.values() if base is not None)
    assert fast.fast >= 12 and memo_hits > 100 and 0 < refused < 24


def test_the_progress_line_counts_refused_points_as_it_goes(monkeypatch) -> None:
    from omegaconf import OmegaConf

    from art_hydra.config.problems import Kind, Problem, Severity, fix
    from art_hydra.sweeps import grid

    bad = Problem("seed", 1, "bad", fix(note="-"), Kind.rule, Severity.error)
    warned = Problem("seed", 1, "odd", fix(note="-"), Kind.rule, Severity.warning)
    verdicts = [[bad], [], [warned], [bad, bad], [warned, bad], []]

    class Checker:
        def problems(self, point: list[str], index: int) -> list[Problem]:
            return verdicts[index]

    shown: list[int] = []
    looked: list[int] = []
    counted_errors = grid.errors
    monkeypatch.setattr(grid._Progress, "step", lambda self, invalid: shown.append(invalid))
    monkeypatch.setattr(
        grid, "errors", lambda problems: looked.append(1) or counted_errors(problems)
    )
    config = OmegaConf.create({"hydra": {"launcher": {}}})
    found = grid.preflight_points(Checker(), config, [[f"seed={i}"] for i in range(6)])
    assert found == verdicts
    assert shown == [1, 1, 1, 2, 3, 3]
    assert len(looked) == len(verdicts)  # each point's problems looked at once, not per step


def test_a_section_set_to_null_at_some_points_gets_the_full_verdict_at_all(tmp_path) -> None:
    """``task.environment=null`` keeps the section's node and swaps its content: the
    points after it, whatever they set under it, are checked as full composition checks
    them."""
    envs = [
        "task.environment=null",
        "task.environment._target_=os.system",
        "task.environment._target_=art_hydra.tasks.tool_lookup.LookupEnv",
        "task.environment._target_=art_hydra.tasks.rewards.exact_match",
    ]
    loader, master = _master(str(tmp_path / "sweep"), ["task=tool_lookup"])
    hand = sweep_hand(master)
    fast = PointChecker(loader, master, hand)
    full = PointChecker(loader, master, hand, fast_way=False)
    points = [["task=tool_lookup", env, f"seed={s}"] for s in (1, 2) for env in envs]
    points += [points[1], points[0], points[2], points[3]]
    verdicts = set()
    for number, point in enumerate(points):
        expected = full.problems(point, number)
        assert _fields(fast.problems(point, number)) == _fields(expected), point
        verdicts.add(tuple(_fields(expected)))
    assert len(verdicts) > 1


def test_a_value_the_users_primary_config_sets_is_theirs_at_every_sweep_point(tmp_path) -> None:
    """A key the user's own primary config (``--config-dir``/``--config-name``) sets, and
    the run never reads, is their setting at a sweep point as in a single run: the same
    warning, both ways."""
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "exp.yaml").write_text("defaults:\n  - config\n  - _self_\nmodel:\n  lora:\n    r: 8\n")
    loader = make_loader(str(mine))
    single = compose_and_check(loader, "exp", [], RunMode.RUN).problems
    inert = [p for p in single if p.key == "model.lora.r"]
    assert [p.severity for p in inert] == [Severity.warning], single
    master = loader.load_configuration(
        "exp", [f"hydra.sweep.dir={tmp_path / 'sweep'}"], run_mode=RunMode.MULTIRUN
    )
    hand = sweep_hand(master)
    # A group change gives the fast way a base of its own, with the same primary config.
    points = [["seed=1"], ["seed=2", "trainer.learning_rate=3e-4"], ["task=digit_sum"]]
    fast = PointChecker(loader, master, hand)
    for checker in (fast, PointChecker(loader, master, hand, fast_way=False)):
        for number, point in enumerate(points):
            found = [p for p in checker.problems(point, number) if p.key == "model.lora.r"]
            assert _fields(found) == _fields(inert), (checker.fast, point)
    assert fast.fast == len(points)  # each point went the fast way, none fell back
