"""The config layer: schema, bounds, ConfigStore registration, validators, reports, compose.

Everything in this package is import-light (hydra and omegaconf only) so that a bad
configuration is rejected in a fraction of a second, before torch is ever imported.
"""

from art_hydra.config.composition import compose, validate
from art_hydra.config.problems import (
    ConfigValidationError,
    Fix,
    Kind,
    Problem,
    Severity,
    fix,
)
from art_hydra.config.schema import RunConfig
from art_hydra.config.validator_registry import ENTRY_POINT_GROUP, registered_validators, validator

__all__ = [
    "ENTRY_POINT_GROUP",
    "ConfigValidationError",
    "Fix",
    "Kind",
    "Problem",
    "RunConfig",
    "Severity",
    "compose",
    "fix",
    "registered_validators",
    "validate",
    "validator",
]
