"""The objective a job returns to a sweeper: its keys, its validator, the reduce over the
logged window, and RunResult, a float that still carries the run's summary."""

from __future__ import annotations

import math
import pickle

import pytest
from conftest import problem_about

from art_hydra import ConfigValidationError, compose
from art_hydra.config.objective import (
    AUTO_METRIC,
    STEP_METRICS,
    logged_metrics,
    resolve,
)
from art_hydra.config.problems import Severity
from art_hydra.config.schema import AlgorithmName
from art_hydra.engine.result import RunResult, hparams_of, objective_value, windowed_metrics


def test_the_default_objective_works_for_both_algorithms() -> None:
    """metric=auto and direction=auto: RL maximises reward_mean, SFT minimises loss."""
    rl = compose([])
    sft = compose(["algorithm=sft"])
    assert resolve(rl.objective, rl.algorithm.name).as_dict() == {
        "metric": "reward_mean",
        "reduce": "last",
        "window": 1,
        "direction": "maximize",
    }
    assert resolve(sft.objective, sft.algorithm.name).metric == "loss"
    assert resolve(sft.objective, sft.algorithm.name).direction == "minimize"


def test_an_explicit_direction_and_metric_win_over_auto() -> None:
    cfg = compose(
        [
            "objective.metric=tokens_per_s",
            "objective.reduce=mean",
            "objective.window=3",
            "objective.direction=minimize",
            "trainer.max_steps=10",
        ]
    )
    spec = resolve(cfg.objective, cfg.algorithm.name)
    assert (spec.metric, spec.reduce, spec.window, spec.direction) == (
        "tokens_per_s",
        "mean",
        3,
        "minimize",
    )
    auto = compose(["objective.metric=grad_norm"])
    assert resolve(auto.objective, auto.algorithm.name).direction == "minimize"


def test_a_metric_the_algorithm_never_logs_is_refused_naming_the_valid_ones() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["algorithm=sft", "objective.metric=reward_mean"])
    problem = problem_about(info.value, "objective.metric")
    assert problem.value == "reward_mean"
    assert "only algorithm=rl does" in problem.reason
    for name in logged_metrics(AlgorithmName.sft):
        assert name in problem.reason
    assert dict(problem.fix.sets) == {"objective.metric": "auto"}
    with pytest.raises(ConfigValidationError) as info:
        compose(["objective.metric=rewrd_mean"])
    assert "no metric of metrics.jsonl" in problem_about(info.value, "objective.metric").reason


@pytest.mark.parametrize(
    "overrides",
    [
        ["objective.metric=loss", "algorithm=sft"],
        ["objective.metric=kl"],
        ["objective.metric=auto", "algorithm=sft"],
        ["objective.reduce=max", "objective.window=5", "trainer.max_steps=20"],
    ],
)
def test_objectives_that_can_work_pass(overrides: list[str]) -> None:
    compose(overrides)


def test_bad_values_of_the_other_keys_are_refused() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["objective.window=0"])
    assert problem_about(info.value, "objective.window").value == 0
    with pytest.raises(ConfigValidationError, match=r"objective\.reduce"):
        compose(["objective.reduce=median"])
    with pytest.raises(ConfigValidationError, match=r"objective\.direction"):
        compose(["objective.direction=up"])


def test_a_window_longer_than_the_logged_steps_is_a_warning() -> None:
    from art_hydra.config.composition import check

    _, problems = check(compose(["trainer.max_steps=4", "objective.window=8"]))
    found = problem_about(problems, "objective.window")
    assert found.severity == Severity.warning
    assert dict(found.fix.sets) == {"objective.window": 4}
    _, problems = check(compose(["trainer.max_steps=4", "logging.every_steps=5"]))
    nothing = problem_about(problems, "logging.every_steps")
    assert nothing.severity == Severity.warning and "only the last step" in nothing.reason


ROWS = [
    {"step": 1, "reward_mean": 0.1, "loss": 3.0},
    {"step": 2, "reward_mean": None, "loss": 2.0},
    {"step": 3, "reward_mean": 0.5, "loss": 4.0},
    {"step": 4, "reward_mean": 0.3, "loss": float("nan")},
]


@pytest.mark.parametrize(
    ("reduce", "window", "expected"),
    [
        ("last", 1, 0.3),
        ("mean", 2, 0.4),
        ("max", 4, 0.5),
        ("min", 4, 0.1),
        ("mean", 3, 0.4),  # the null of step 2 is skipped, not counted as 0
        ("last", 100, 0.3),
    ],
)
def test_the_objective_reduces_the_metric_over_the_last_logged_steps(
    reduce: str, window: int, expected: float
) -> None:
    cfg = compose([f"objective.reduce={reduce}", f"objective.window={window}"])
    spec = resolve(cfg.objective, cfg.algorithm.name)
    assert objective_value(spec, ROWS) == pytest.approx(expected)


def test_no_logged_value_is_nan_and_windowed_metrics_skip_non_finite() -> None:
    cfg = compose(["objective.reduce=min", "objective.window=2"])
    spec = resolve(cfg.objective, cfg.algorithm.name)
    assert math.isnan(objective_value(spec, []))
    assert math.isnan(objective_value(spec, [{"step": 1, "reward_mean": None}]))
    assert windowed_metrics(spec, ROWS) == {"reward_mean": 0.3, "loss": 4.0}


def test_run_result_is_a_float_that_still_reads_as_the_summary() -> None:
    summary = {"run_dir": "/r", "steps": 3, "final": {"loss": 1.5}, "status": "done"}
    result = RunResult(0.25, summary)
    assert isinstance(result, float) and float(result) == 0.25
    assert result > 0.2 and result + 1 == 1.25 and max([result, 0.1]) == 0.25
    assert result["steps"] == 3 and result.get("plot") is None and "final" in result
    assert result.run_dir == "/r" and result.status == "done"
    assert dict(result) == summary
    assert result == summary and result == 0.25
    assert hash(result) == hash(0.25)
    with pytest.raises(AttributeError):
        _ = result.missing
    # A launcher in another process sends it back pickled.
    back = pickle.loads(pickle.dumps(result))
    assert type(back) is RunResult and back == 0.25 and back.summary == summary
    assert math.isnan(RunResult(float("nan"), {"dry_run": True}))
    assert RunResult(float("nan"), {"dry_run": True}) == {"dry_run": True}


def test_overrides_become_typed_hparams() -> None:
    assert hparams_of(
        [
            "trainer.learning_rate=0.001",
            "trainer.max_steps=3",
            "+task.params.x=true",
            "algorithm=sft",
            "~logging.plot",
            "rl.temperature=nan",
        ]
    ) == {
        "trainer.learning_rate": 0.001,
        "trainer.max_steps": 3,
        "task.params.x": True,
        "algorithm": "sft",
        "rl.temperature": "nan",
    }


def test_the_catalogue_names_every_metric_a_step_records() -> None:
    """recipe._step_metrics writes exactly the catalogue's metrics (plus the step)."""
    import inspect

    from art_hydra.engine import recipe

    source = inspect.getsource(recipe._step_metrics)
    for name in STEP_METRICS:
        assert f'"{name}"' in source, name
    assert set(AUTO_METRIC) == set(AlgorithmName)


@pytest.mark.parametrize(
    ("metric", "setting"),
    [
        ("cispo_capped_fraction", ["rl.loss_type=cispo", "rl.epsilon_high=5.0"]),
        ("step_skipped", ["model.dtype=float16"]),
    ],
)
def test_a_metric_only_some_settings_log_is_taken_with_them_only(
    metric: str, setting: list[str]
) -> None:
    cfg = compose([f"objective.metric={metric}", *setting])
    assert resolve(cfg.objective, cfg.algorithm.name).direction == "minimize"
    assert metric in logged_metrics(AlgorithmName.rl, cfg)
    assert metric not in logged_metrics(AlgorithmName.rl)
    with pytest.raises(ConfigValidationError) as info:
        compose([f"objective.metric={metric}"])
    reason = problem_about(info.value, "objective.metric").reason
    assert "only runs with" in reason and setting[0] in reason


def test_step_skipped_is_taken_where_loss_scaling_may_run_and_only_there() -> None:
    """A folder's own dtype under ``auto`` is known only once it loads (it may be float16);
    the tiny model under ``auto`` is float32, and Unsloth trains without a loss scaler."""
    folder = ["model.source=pretrained", "model.name=/models/m", "model.dtype=auto"]
    cfg = compose(folder)
    assert "step_skipped" in logged_metrics(AlgorithmName.rl, cfg)
    assert "step_skipped" not in logged_metrics(AlgorithmName.rl, compose(["model.dtype=auto"]))
    unsloth = compose(["backend=unsloth", "model.dtype=float16"])
    assert "step_skipped" not in logged_metrics(AlgorithmName.rl, unsloth)
