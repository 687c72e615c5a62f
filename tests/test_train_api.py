"""The public train() entry validates configs built by hand, like every other path."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from art_hydra import ConfigValidationError, RunConfig, compose, train
from art_hydra.config.schema import AlgorithmName


def _hand_built() -> RunConfig:
    cfg = RunConfig()
    cfg.model.name = "my-model"
    cfg.task.name = "mine"
    cfg.task.generator = "my_pkg.examples"
    cfg.task.reward._target_ = "my_pkg.reward"
    return cfg


def test_train_rejects_a_hand_built_dataclass() -> None:
    cfg = _hand_built()
    cfg.trainer.gradient_accumulation_steps = 2
    with pytest.raises(ConfigValidationError) as info:
        train(cfg)
    assert [p.key for p in info.value.problems] == ["trainer.gradient_accumulation_steps"]
    assert "nothing was trained" in str(info.value)


def test_train_reports_every_problem_of_a_plain_dict() -> None:
    with pytest.raises(ConfigValidationError) as info:
        train(
            {
                "trainer": {"learning_rate": "fast", "gradient_accumulation_steps": 3},
                "rl": {"num_generations": 1},
                "extra": True,
            }
        )
    keys = {p.key for p in info.value.problems}
    assert {
        "trainer.learning_rate",
        "extra",
        "rl.num_generations",
        "model.name",
        "task.name",
    } <= keys


def test_train_accepts_valid_configs(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = _hand_built()
    cfg.algorithm.name = AlgorithmName.sft
    cfg.trainer.gradient_accumulation_steps = 2  # fine in SFT
    typed = train(cfg)
    assert typed.trainer.gradient_accumulation_steps == 2
    assert "configuration valid" in capsys.readouterr().out
    composed = compose(["dry_run=true"])
    assert OmegaConf.is_config(train(composed))
    assert "dry run" in capsys.readouterr().out
