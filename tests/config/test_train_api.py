"""The public train() entry validates configs built by hand, like every other path."""

from __future__ import annotations

from pathlib import Path

import pytest

from art_hydra import ConfigValidationError, RunConfig, compose, train
from art_hydra.config.schema import AlgorithmName, FinetuneMethod, ModelSource
from art_hydra.engine.metrics import read_metrics


def _hand_built() -> RunConfig:
    """A complete run built in Python: the tiny model on the digit-sum task, briefly."""
    cfg = RunConfig()
    cfg.model.name = "tiny"
    cfg.model.source = ModelSource.tiny
    cfg.model.max_seq_length = 32
    cfg.model.finetune = FinetuneMethod.full
    cfg.task.name = "sums"
    cfg.task.generator = "art_hydra.tasks.toy.digit_sum_examples"
    cfg.task.reward._target_ = "art_hydra.tasks.rewards.exact_match"
    cfg.rl.max_prompt_length, cfg.rl.max_completion_length = 8, 4
    cfg.sft.max_length = 12
    cfg.trainer.max_steps = 2
    cfg.trainer.per_device_train_batch_size = 8
    cfg.checkpoint.every_steps = 0
    cfg.logging.tensorboard = cfg.logging.plot = False
    cfg.logging.progress_bar = "off"
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


def test_train_reports_every_wrong_type_of_a_run_config() -> None:
    """A dataclass built by hand gets the CLI's complete report, not OmegaConf's first error."""
    cfg = _hand_built()
    cfg.trainer.learning_rate = "fast"  # type: ignore[assignment]
    cfg.rl.num_generations = "eight"  # type: ignore[assignment]
    cfg.backend.device = "gpu"  # type: ignore[assignment]
    cfg.trainer.gradient_accumulation_steps = 2
    with pytest.raises(ConfigValidationError) as info:
        train(cfg)
    assert {p.key for p in info.value.problems} == {
        "trainer.learning_rate",
        "rl.num_generations",
        "backend.device",
        "trainer.gradient_accumulation_steps",
    }


@pytest.mark.slow
def test_train_runs_valid_hand_built_configs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _hand_built()
    cfg.algorithm.name = AlgorithmName.sft
    cfg.trainer.gradient_accumulation_steps = 2  # fine in SFT
    summary = train(cfg, run_dir=tmp_path / "sft")
    assert summary["steps"] == 2
    assert len(read_metrics(tmp_path / "sft")) == 2
    assert (tmp_path / "sft" / "checkpoints" / "step-000002" / "model.safetensors").is_file()
    assert train(compose(["dry_run=true"])) == {"dry_run": True}
    assert "dry run" in capsys.readouterr().out
