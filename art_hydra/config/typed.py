"""The validated config as typed objects: the engine's builders take its sections.

Validation (:func:`art_hydra.config.composition.validate`) returns a ``DictConfig``
typed by :class:`~art_hydra.config.schema.RunConfig`; the run turns it into dataclass
objects once (``OmegaConf.to_object``) so a builder receives, say, a
:class:`~art_hydra.config.schema.TrainerConfig` whose fields a type checker knows.
What needs the ``DictConfig`` itself (the run's ``run_config.yaml``, its identity,
resume comparisons, the trackers' config) keeps using it: both hold the same values.
Torch-free, like the rest of the config layer.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config.schema import RunConfig


def typed_config(cfg: Any) -> RunConfig:
    """``cfg`` (a validated ``DictConfig``, or already a :class:`RunConfig`) as a
    :class:`RunConfig` object: enums stay enums, mappings and lists become plain
    ``dict``/``list``, interpolations are resolved."""
    if isinstance(cfg, RunConfig):
        return cfg
    if not isinstance(cfg, DictConfig) or OmegaConf.get_type(cfg) is not RunConfig:
        raise TypeError(
            f"typed_config needs a validated run config (a DictConfig of RunConfig), "
            f"got {type(cfg).__name__}"
        )
    run = OmegaConf.to_object(cfg)
    assert isinstance(run, RunConfig)
    return run
