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
from art_hydra.run import train
from art_hydra.tasks.markers import environment, generator, reward, tool

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
