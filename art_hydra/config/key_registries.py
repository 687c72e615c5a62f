"""The registries whose names a string key accepts (``setting(..., registry=...)``).

A key bound to a registry takes any registered name: the bound walker checks it (the
nearest name offered for a typo, as for the schema's fixed choices), and the key
table, ``--help`` and the JSON Schema list the names registered when they are generated.
"""

from __future__ import annotations

from typing import Any

from art_hydra.config import advantage_estimators, backends, policy_losses, rollout_engines
from art_hydra.config.plugin_registry import PluginRegistry
from art_hydra.config.problems import Kind, Problem, Severity
from art_hydra.config.trl_names import trl_loss_type_fix

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


def foreign_name_problem(registry: str, path: str, value: str) -> Problem | None:
    """A value another library's users type for this registry's key, meaning settings
    of other keys here (TRL's ``loss_type=dapo`` is ``rl.loss_type=ppo_clip
    rl.loss_aggregation=dapo``): the problem with the fix that sets them all, or None.
    Asked only for a name the registry does not hold, so a plugin may take the name."""
    if registry != "policy_loss":
        return None
    found = trl_loss_type_fix(value)
    if found is None:
        return None
    why, repair = found
    return Problem(path, value, why, repair, Kind.bound, Severity.error)


def load_problems() -> list[Problem]:
    """The plugins of these registries that failed to import: a loss, backend or
    estimator a user installed is named when it is missing, whichever key is set."""
    return [p for named in REGISTRIES.values() for p in named.load_problems()]
