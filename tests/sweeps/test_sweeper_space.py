"""What a sweep searches is read the way its sweeper reads it, through the real CLI: a
key given both fixed and swept (or swept twice) is refused before any job, for the
pre-flight grid sweeper, Hydra's basic sweeper and Optuna alike; Optuna's own reading of
a range (its upper end included) is what the pre-flight checks; and a study whose drawn
trials keep being refused stops at its bound, naming what refused them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, report_entries, run_cli

pytestmark = pytest.mark.fast

OPTUNA = ["hydra/sweeper=optuna", "hydra.sweeper.direction=maximize"]


def _sweep(tmp_path: Path, *args: str) -> tuple[int, str]:
    proc = run_cli("-m", *args, f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    return proc.returncode, output_of(proc)


@pytest.mark.parametrize("sweeper", [[], ["hydra/sweeper=basic"], OPTUNA])
def test_a_key_given_fixed_and_swept_is_refused_with_the_override_to_keep(
    tmp_path: Path, sweeper: list[str]
) -> None:
    """Optuna would run every trial with the fixed value (and report ``Best parameters:
    {}``); the basic sweeper would sweep the choices: neither is assumed."""
    code, out = _sweep(tmp_path, *sweeper, "rl.num_generations=8", "rl.num_generations=choice(2,4)")
    assert code == 1, out
    assert report_entries(out) == [
        (
            "rl.num_generations",
            "8 (fixed) and choice(2,4) (swept)",
            "keep one and drop the other(s): rl.num_generations=choice(2,4) (sweep it) or "
            "rl.num_generations=8 (every job with it)",
        )
    ]
    assert "Traceback" not in out
    assert not (tmp_path / "sweep").exists()  # before any job folder
    # The kept override alone passes (a dry run: nothing is launched).
    code, out = _sweep(tmp_path, *sweeper, "rl.num_generations=choice(2,4)", "dry_run=true")
    assert code == 0, out
    assert "more than one way" not in out


def test_every_key_given_twice_is_named_in_one_report(tmp_path: Path) -> None:
    code, out = _sweep(
        tmp_path,
        *OPTUNA,
        "trainer.learning_rate=choice(1e-4,1e-3)",
        "trainer.learning_rate=3e-4",
        "rl.temperature=choice(0.7,0.9)",
        "rl.temperature=interval(0.7,1.2)",
    )
    assert code == 1, out
    entries = report_entries(out)
    assert [(k, v) for k, v, _ in entries] == [
        ("trainer.learning_rate", "choice(1e-4,1e-3) (swept) and 3e-4 (fixed)"),
        ("rl.temperature", "choice(0.7,0.9) (swept) and interval(0.7,1.2) (swept)"),
    ]
    assert entries[1][2] == (
        "keep one and drop the other(s): rl.temperature=choice(0.7,0.9) (sweep it) or "
        "rl.temperature=interval(0.7,1.2) (sweep it)"
    )
    assert "The study was not started." in out
    assert not (tmp_path / "sweep").exists()


def test_the_preflight_reads_optunas_range_with_its_upper_end(tmp_path: Path) -> None:
    """Hydra's ``range(1,2)`` is [1]; the Optuna sweeper makes it an integer distribution
    from 1 to 2, and draws 2 (RL cannot accumulate): the pre-flight says so first."""
    code, out = _sweep(
        tmp_path,
        *OPTUNA,
        "hydra.sweeper.n_trials=1",
        "dry_run=true",
        "trainer.gradient_accumulation_steps=range(1,2)",
    )
    assert code == 0, out
    assert "1 of 2 combination(s) of the search space cannot run" in out
    assert "trainer.gradient_accumulation_steps = 2" in out
    # The basic sweeper's range(1,2) holds 1 alone: nothing to refuse.
    code, out = _sweep(tmp_path, "trainer.gradient_accumulation_steps=range(1,2)", "dry_run=true")
    assert code == 0, out
    assert "cannot run" not in out and "pre-flight passed for 1 of 1" in out


def test_a_study_whose_trials_keep_being_refused_stops_at_its_bound(tmp_path: Path) -> None:
    """Refused trials do not count against n_trials, so a study over a space that almost
    never runs would ask forever: it stops after 10 x n_trials refusals, each recorded
    under refused/, naming the key that refused them."""
    code, out = _sweep(
        tmp_path,
        *OPTUNA,
        "hydra.sweeper.n_trials=1",
        "hydra.sweeper.sampler.seed=0",
        # Only 1 of 1000 values can run (RL cannot accumulate gradients).
        "trainer.gradient_accumulation_steps=int(interval(1,1000))",
    )
    assert code == 1, out
    assert "The study stopped: 10 drawn trials were refused (10 x hydra.sweeper.n_trials=1" in out
    assert "10 x trainer.gradient_accumulation_steps (values " in out
    assert "Traceback" not in out
    sweep = tmp_path / "sweep"
    records = sorted((sweep / "refused").glob("*/result.json"))
    assert [r.parent.name for r in records] == [str(k) for k in range(10)]
    first = json.loads(records[0].read_text())
    assert first["status"] == "refused" and first["job_num"] is None
    assert any(o.startswith("trainer.gradient_accumulation_steps=") for o in first["overrides"])
    assert "trainer.gradient_accumulation_steps" in first["reason"]
    assert not [p for p in sweep.iterdir() if p.name.isdigit()]  # no job ever started


def test_a_large_integer_range_is_checked_value_by_value_not_at_its_ends(
    tmp_path: Path,
) -> None:
    """Both ends of range(3,200) cannot run (the batch of 128 is no multiple of 3 or 200)
    but 4, 8, ... can: the study starts, naming the values it will refuse."""
    code, out = _sweep(tmp_path, *OPTUNA, "rl.num_generations=range(3,200)", "dry_run=true")
    assert code == 0, out
    assert "No combination of the search space can run" not in out
    assert "combination(s) of the search space cannot run" in out
    # Every value of a short range listed, none can run: refused before the study.
    code, out = _sweep(
        tmp_path, *OPTUNA, "trainer.gradient_accumulation_steps=range(2,4)", "dry_run=true"
    )
    assert code == 1, out
    assert "No combination of the search space can run; the study was not started." in out


def test_stepped_values_are_the_ones_optuna_draws() -> None:
    """The checked values of a stepped distribution equal those Optuna's samplers draw,
    float rounding included (0.30000000000000004 is drawn and written so)."""
    import logging

    import optuna
    from optuna.distributions import DiscreteUniformDistribution, IntUniformDistribution

    from art_hydra.sweeps.sweeper_space import _values

    optuna.logging.set_verbosity(logging.WARNING)
    for dist in (DiscreteUniformDistribution(0.1, 1.0, 0.1), IntUniformDistribution(3, 30, 3)):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        drawn = set()
        for _ in range(300):
            trial = study.ask({"x": dist})
            drawn.add(trial.params["x"])
            study.tell(trial, 0.0)
        assert set(_values(dist, grid=False)) == drawn
    assert 0.30000000000000004 in _values(DiscreteUniformDistribution(0.1, 1.0, 0.1), False)


@pytest.mark.parametrize("sweeper", [[], ["hydra/sweeper=basic"]])
def test_a_delete_then_a_swept_add_replaces_the_entry_at_each_point(
    tmp_path: Path, sweeper: list[str]
) -> None:
    """``~k '+k=3,4'`` is neither fixed nor swept twice: each point deletes, then adds."""
    code, out = _sweep(
        tmp_path, *sweeper, "~task.params.length", "+task.params.length=3,4", "dry_run=true"
    )
    assert code == 0, out
    assert "more than one way" not in out
    assert "~task.params.length=null ++task.params.length=4" in out


def test_optuna_refuses_a_delete_that_would_undo_every_draw(tmp_path: Path) -> None:
    """The Optuna sweeper writes its fixed overrides after the drawn ones: ``~k`` would
    delete every drawn value, so it is refused with the override that sweeps the entry."""
    code, out = _sweep(tmp_path, *OPTUNA, "~task.params.length", "+task.params.length=3,4")
    assert code == 1, out
    assert report_entries(out) == [
        (
            "task.params.length",
            "~task.params.length and 3,4 (swept)",
            "drop ~task.params.length and sweep the key over its entry: ++task.params.length=3,4",
        )
    ]
    assert not (tmp_path / "sweep").exists()


def test_a_key_given_twice_is_explained_as_the_later_override_replacing_the_earlier(
    tmp_path: Path,
) -> None:
    code, out = _sweep(tmp_path, "rl.num_generations=choice(2,4)", "rl.num_generations=8")
    assert code == 1, out
    assert "keeps the later override of the key and drops the earlier one" in out
    assert "cross" not in out


def test_a_refused_point_drawn_again_by_a_continued_study_is_recorded_once(
    tmp_path: Path,
) -> None:
    """A study continued with ``resume=auto`` may draw a refused point again: it is not
    recorded a second time (the summary counts distinct refused points)."""
    import optuna

    from art_hydra.config.problems import Problem
    from art_hydra.sweeps.optuna_trials import _record

    trial = optuna.create_study().ask()
    problems = [Problem("rl.num_generations", 3, "does not divide the batch", "fix")]
    first = _record(tmp_path, trial, ["rl.num_generations=3"], problems, "cause")
    again = _record(tmp_path, trial, ["rl.num_generations=3", "resume=auto"], problems, "cause")
    other = _record(tmp_path, trial, ["rl.num_generations=5", "resume=auto"], problems, "c")
    assert first == again == tmp_path / "refused" / "0"
    assert other == tmp_path / "refused" / "1"
    assert sorted(p.name for p in (tmp_path / "refused").iterdir()) == ["0", "1"]
