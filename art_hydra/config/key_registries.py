"""The registries whose names a string key accepts (``setting(..., registry=...)``).

A key bound to a registry takes any registered name: the bound walker checks it (the
nearest name offered for a typo, as for the schema's fixed choices), and the key
table, ``--help`` and the JSON Schema list the names registered when they are generated.
"""

from __future__ import annotations

from typing import Any

from art_hydra.config import advantage_estimators, backends, policy_losses, rollout_engines
from art_hydra.config.plugin_registry import PluginRegistry
from art_hydra.config.problems import Problem

#: Registry name (as ``setting(..., registry=...)`` writes it) -> the registry.
REGISTRIES: dict[str, PluginRegistry[Any]] = {
    "policy_loss": policy_losses.REGISTRY,
    "backend": backends.REGISTRY,
    "advantage_estimator": advantage_estimators.REGISTRY,
    "rollout_engine": rollout_engines.REGISTRY,
}


def registered_names(registry: str) -> tuple[str, ...]:
    """The names registered in ``registry`` (plugins loaded)."""
    return REGISTRIES[registry].names()


def describe_registry(registry: str) -> str:
    """The key's limits in words: "a registered policy loss (ppo_clip, cispo)"."""
    named = REGISTRIES[registry]
    return f"a registered {named.what} ({', '.join(named.names())})"


def load_problems() -> list[Problem]:
    """The plugins of these registries that failed to import: a loss, backend or
    estimator a user installed is named when it is missing, whichever key is set."""
    return [p for named in REGISTRIES.values() for p in named.load_problems()]
