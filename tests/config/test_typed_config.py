"""The engine's typed config: the validated ``DictConfig`` becomes ``RunConfig`` objects
once, and the builders take their sections. These hold the values the DictConfig holds
(the run's records are still written from the DictConfig, so they cannot change)."""

from __future__ import annotations

import dataclasses

import pytest
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.config.schema import (
    CheckpointConfig,
    LoggingConfig,
    QueueConfig,
    RunConfig,
    SchedulerType,
    TrainerConfig,
)
from art_hydra.config.typed import typed_config

pytestmark = pytest.mark.fast


def test_the_validated_config_becomes_typed_sections_with_the_same_values() -> None:
    cfg = compose(["algorithm=sft", "trainer.gradient_accumulation_steps=2"])
    run = typed_config(cfg)
    assert isinstance(run, RunConfig)
    assert isinstance(run.trainer, TrainerConfig) and isinstance(run.queue, QueueConfig)
    assert isinstance(run.checkpoint, CheckpointConfig) and isinstance(run.logging, LoggingConfig)
    assert run.trainer.gradient_accumulation_steps == 2
    # Enums stay enums; mappings and lists become plain Python ones.
    assert run.trainer.lr_scheduler_type is SchedulerType(cfg.trainer.lr_scheduler_type)
    assert type(run.task.params) is dict and type(run.model.lora.target_modules) is list
    # Converting back gives the same YAML the run writes from the DictConfig.
    assert OmegaConf.to_yaml(OmegaConf.structured(run)) == OmegaConf.to_yaml(cfg)
    assert typed_config(run) is run


def test_only_a_validated_run_config_converts() -> None:
    with pytest.raises(TypeError, match="validated run config"):
        typed_config(OmegaConf.create({"trainer": {"max_steps": 3}}))


def test_the_engine_builders_are_annotated_with_their_sections() -> None:
    import typing

    from art_hydra.config import schema
    from art_hydra.engine.queue import StepChannel
    from art_hydra.engine.trainer import Trainer, build_optimizer
    from art_hydra.runs.checkpoint import Checkpointer

    def hint(fn: object, name: str) -> object:
        # The engine imports the section types for type checkers only.
        return typing.get_type_hints(fn, localns=vars(schema))[name]

    assert hint(StepChannel.__init__, "queue_cfg") is QueueConfig
    assert hint(Checkpointer.__init__, "checkpoint_cfg") is CheckpointConfig
    assert hint(Trainer.__init__, "trainer_cfg") is TrainerConfig
    assert hint(build_optimizer, "trainer_cfg") is TrainerConfig
    assert {f.name for f in dataclasses.fields(RunConfig)} >= {"trainer", "queue", "checkpoint"}
