"""The sweep pre-flight's fast way gives each point the verdict full composition gives.

:class:`~art_hydra.sweeps.preflight.PointChecker` composes once per group selection and
checks a point by setting its values on the shared base; the tests draw random grids
(plain values, bad values, group choices, ``+``/``~`` overrides, ``${hydra:...}`` and
other interpolations, values a config file may not choose) and compare every point's
problems, field by field, with those of full composition as the job would compose it.
"""

from __future__ import annotations

import random

import pytest
from hydra.types import RunMode

from art_hydra.config.composition import make_loader
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
    [(1, []), (2, ["hydra.sweep.subdir=${hydra.job.override_dirname}"]), (3, ["strict=true"])],
)
def test_random_points_get_the_verdict_of_full_composition(
    tmp_path, seed: int, master_extra: list[str]
) -> None:
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
