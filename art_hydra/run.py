"""The public training entry point.

``train(cfg)`` is what every job runs and what Python callers use with a config built
by hand: it validates first, with the same validators as composition, so no path
reaches training unvalidated.
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from art_hydra.config.compose import validate

#: How a report raised inside a job ends: the job's folder exists, nothing else does.
_JOB_FOOTER = "The job stopped before loading a model; nothing was trained."


def train(cfg: Any) -> DictConfig:
    """Validate ``cfg`` and run it; returns the validated, typed config.

    ``cfg`` may be a composed ``DictConfig``, a :class:`~art_hydra.config.schema.RunConfig`
    or a plain mapping. Until the training engine lands, a valid config is printed,
    resolved, and nothing is trained.
    """
    typed = validate(cfg, footer=_JOB_FOOTER)
    resolved = OmegaConf.to_yaml(typed, resolve=True)
    if typed.dry_run:
        print(f"{resolved}\ndry run: the configuration is valid; nothing was trained.")
    else:
        print(
            f"{resolved}\nconfiguration valid. The training engine is not part of this "
            "release yet, so nothing was trained."
        )
    return typed
