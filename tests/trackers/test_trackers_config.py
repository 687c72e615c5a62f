"""``logging.report_to`` as composition and the pre-flight see it: tracker names checked
with the nearest one offered, ``none`` alone, duplicates, ``logging.tensorboard``'s old
meaning kept; a chosen tracker whose library is missing named with its pip command; W&B
online without a key refused; and no tracker library imported on the way. Also the
flattening of both sample-row shapes into one table row per completion."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.problems import Problem, Severity
from art_hydra.config.tracker_names import chosen_trackers
from art_hydra.preflight import trackers as tracker_preflight
from art_hydra.preflight import world_problems
from art_hydra.trackers.base import sample_rows, table


def _problems(overrides: list[str], tmp_path: Path) -> list[Problem]:
    result = compose_and_check(
        make_loader(), "config", [*overrides, f"hydra.run.dir={tmp_path}/run"], RunMode.RUN
    )
    return [p for p in result.problems if p.key.startswith("logging.")]


def test_a_misspelt_tracker_is_an_error_whose_fix_is_the_nearest_name(tmp_path: Path) -> None:
    (problem,) = _problems(["logging.report_to=[tensorboard,wandbb]"], tmp_path)
    assert problem.severity == Severity.error and problem.value == "wandbb"
    assert "did you mean wandb?" in problem.reason
    assert problem.fix.overrides() == ["logging.report_to=[tensorboard,wandb]"]
    assert not _problems(problem.fix.overrides(), tmp_path)


def test_an_unknown_tracker_without_a_near_name_lists_the_known_ones(tmp_path: Path) -> None:
    (problem,) = _problems(["logging.report_to=[comet]"], tmp_path)
    assert "tensorboard, wandb, mlflow, trackio, none" in problem.reason
    assert "did you mean" not in problem.reason


def test_none_with_other_trackers_is_an_error(tmp_path: Path) -> None:
    (problem,) = _problems(["logging.report_to=[none,mlflow]"], tmp_path)
    assert problem.severity == Severity.error and "none means no tracker" in problem.reason
    assert problem.fix.overrides() == ["logging.report_to=[mlflow]"]


def test_a_tracker_named_twice_is_a_warning(tmp_path: Path) -> None:
    (problem,) = _problems(["logging.report_to=[mlflow,mlflow]"], tmp_path)
    assert problem.severity == Severity.warning
    assert problem.fix.overrides() == ["logging.report_to=[mlflow]"]


def test_tensorboard_switch_keeps_its_old_meaning(tmp_path: Path) -> None:
    # false with the default report_to: the old way to turn TensorBoard off, no word.
    assert not _problems(["logging.tensorboard=false"], tmp_path)
    (problem,) = _problems(["logging.report_to=[wandb]", "logging.tensorboard=true"], tmp_path)
    assert problem.severity == Severity.warning and "adds TensorBoard" in problem.reason
    (problem,) = _problems(
        ["logging.report_to=[tensorboard,mlflow]", "logging.tensorboard=false"], tmp_path
    )
    assert problem.severity == Severity.warning and "drops TensorBoard" in problem.reason


@pytest.mark.parametrize(
    ("report_to", "switch", "chosen"),
    [
        (["tensorboard"], None, ["tensorboard"]),
        (["tensorboard"], False, []),
        (["wandb"], True, ["tensorboard", "wandb"]),
        (["none"], None, []),
        (["mlflow", "trackio", "mlflow"], None, ["mlflow", "trackio"]),
    ],
)
def test_chosen_trackers(report_to: list[str], switch: bool | None, chosen: list[str]) -> None:
    cfg = OmegaConf.create({"report_to": report_to, "tensorboard": switch})
    assert chosen_trackers(cfg) == chosen


def test_a_missing_tracker_library_names_its_pip_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        tracker_preflight.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "mlflow" else real(name, *a),
    )
    cfg = compose(["logging.report_to=[tensorboard,mlflow]"])
    (problem,) = tracker_preflight.tracker_problems(cfg)
    assert problem.severity == Severity.error and problem.value == "mlflow"
    assert 'pip install "art-hydra[mlflow]"' in problem.reason
    assert problem.fix.overrides() == ["logging.report_to=[tensorboard]"]
    assert 'pip install "art-hydra[mlflow]"' in problem.fix.render()


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="wandb not installed")
def test_wandb_online_without_a_key_is_refused_and_offline_is_not(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    cfg = compose(["logging.report_to=[wandb]"])
    (problem,) = tracker_preflight.tracker_problems(cfg)
    assert "no API key" in problem.reason and "WANDB_MODE=offline" in problem.fix.render()
    assert problem.fix.overrides() == ["logging.report_to=[none]"]
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert tracker_preflight.tracker_problems(cfg) == []
    monkeypatch.delenv("WANDB_MODE")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    assert tracker_preflight.tracker_problems(cfg) == []


def test_composition_and_the_preflight_import_no_tracker_library(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from art_hydra import compose\n"
        "from art_hydra.preflight import world_problems\n"
        "cfg = compose(['logging.report_to=[tensorboard,wandb,mlflow,trackio]'])\n"
        f"world_problems(cfg, {str(tmp_path / 'r')!r})\n"
        "import art_hydra.trackers\n"
        "heavy = [m for m in ('torch', 'wandb', 'mlflow', 'trackio', 'tensorboard')"
        " if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {**os.environ, "WANDB_MODE": "offline"}
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, env=env)


def test_the_default_config_reports_to_tensorboard_and_needs_nothing_more() -> None:
    cfg = compose([])
    assert chosen_trackers(cfg.logging) == ["tensorboard"]
    assert tracker_preflight.tracker_problems(cfg) == []
    assert not [p for p in world_problems(cfg, None) if p.key.startswith("logging.")]


def test_both_sample_shapes_flatten_to_one_row_per_completion() -> None:
    grouped = {
        "prompt": "abc",
        "reference": "cba",
        "completions": [
            {"text": "cba", "reward": 1.0, "rewards": {"exact": 1.0}, "advantage": 0.5},
            {"text": "cab", "reward": 0.0, "rewards": {"exact": 0.0}, "advantage": -0.5},
        ],
    }
    flat = {"prompt": "xy", "reference": "yx", "completion": "yx", "reward": 1.0, "kind": "eval"}
    rows = sample_rows(7, "train", [grouped, flat, {"prompt": "p", "completion": None}])
    assert [(r["group"], r["completion"], r["reward"]) for r in rows] == [
        (0, "cba", 1.0),
        (0, "cab", 0.0),
        (1, "yx", 1.0),
        (2, "", None),
    ]
    assert rows[0]["reward/exact"] == 1.0 and rows[1]["advantage"] == -0.5
    assert rows[2]["kind"] == "eval" and rows[0]["kind"] == "train"
    columns, data = table(rows)
    assert columns[:3] == ["step", "kind", "group"] and columns[-1] == "reward/exact"
    assert len(data) == 4 and all(len(r) == len(columns) for r in data)
    assert data[2][columns.index("reward/exact")] is None


def test_a_link_planted_as_the_trackers_folder_is_refused(tmp_path: Path) -> None:
    from art_hydra.runs.run_folder import UnsafePath
    from art_hydra.trackers import open_trackers

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "trackers").symlink_to(elsewhere)
    logging_cfg = OmegaConf.create({"report_to": ["mlflow"], "tensorboard": None, "project": None})
    with pytest.raises(UnsafePath, match="trackers is a link"):
        open_trackers(run, logging_cfg, {}, None)
    assert list(elsewhere.iterdir()) == []


def test_a_tracker_that_fails_during_the_run_is_dropped_and_the_others_go_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from art_hydra.trackers import Trackers
    from art_hydra.trackers.base import Tracker

    class Broken(Tracker):
        name = "broken"

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            raise ConnectionError("server went away")

    class Kept(Tracker):
        name = "kept"
        seen: list[tuple[int, dict[str, float]]] = []
        closed = ""

        def log_metrics(self, step: int, metrics: dict[str, float]) -> None:
            self.seen.append((step, metrics))

        def close(self, status: str) -> None:
            self.closed = status

    kept = Kept()
    trackers = Trackers([Broken(), kept])
    record = {
        "step": 1,
        "loss": 0.5,
        "time": "2026-12-05T00:00:00Z",
        "kl": None,
        "nan": float("nan"),
    }
    trackers.log_metrics(record)
    trackers.log_metrics({**record, "step": 2})
    assert [t.name for t in trackers.trackers] == ["kept"]
    assert kept.seen == [(1, {"loss": 0.5}), (2, {"loss": 0.5})]  # numbers only
    assert "broken: logging metrics failed (server went away)" in caplog.text
    trackers.close("failed")
    assert kept.closed == "failed"
