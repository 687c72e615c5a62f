"""art_hydra: Hydra-configured RL (GRPO-style) and SFT fine-tuning of language models.

Importing the package is cheap (hydra and omegaconf only); torch and the model
libraries are imported inside the code that trains.
"""

# First: under the command, nothing below may come from the working folder (data).
from art_hydra import import_path as _import_path  # noqa: F401
from art_hydra import moved as _moved  # noqa: F401  (the flat layout's names still import)
from art_hydra.runs import interrupts as _interrupts

if _interrupts.launched_as_command():  # first: a signal during the imports below exits cleanly
    _interrupts.exit_on_signals()

from typing import TYPE_CHECKING

from art_hydra.config import (
    ConfigValidationError,
    Fix,
    Kind,
    Problem,
    RunConfig,
    Severity,
    compose,
    fix,
    validate,
    validator,
)

if TYPE_CHECKING:
    from art_hydra.run import train
    from art_hydra.tasks.markers import environment, generator, reward, tool

#: Names imported on first use: the command's check of a config reads neither the run's
#: way in nor the task markers (and ``import art_hydra`` stays light for a notebook).
_LAZY = {
    "train": "art_hydra.run",
    "environment": "art_hydra.tasks.markers",
    "generator": "art_hydra.tasks.markers",
    "reward": "art_hydra.tasks.markers",
    "tool": "art_hydra.tasks.markers",
}


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module 'art_hydra' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "ConfigValidationError",
    "Fix",
    "Kind",
    "Problem",
    "RunConfig",
    "Severity",
    "compose",
    "environment",
    "fix",
    "generator",
    "reward",
    "tool",
    "train",
    "validate",
    "validator",
]
__version__ = "0.1.0"
