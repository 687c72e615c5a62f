"""The registries whose names a string key accepts (``setting(..., registry=...)``).

A key bound to a registry takes any registered name: the bound walker checks it (the
nearest name offered for a typo, as for the schema's fixed choices), and the README's key
table, ``--help`` and the JSON Schema list the names registered when they are generated.
"""

from __future__ import annotations

from collections.abc import Callable

from art_hydra.config.advantage_estimators import advantage_estimator_names
from art_hydra.config.backends import backend_names
from art_hydra.config.policy_losses import policy_loss_names

#: Registry -> (what one entry is, in words; the names registered now).
REGISTRIES: dict[str, tuple[str, Callable[[], tuple[str, ...]]]] = {
    "policy_loss": ("a registered policy loss", policy_loss_names),
    "backend": ("a registered backend", backend_names),
    "advantage_estimator": ("a registered advantage estimator", advantage_estimator_names),
}


def registered_names(registry: str) -> tuple[str, ...]:
    """The names registered in ``registry`` (plugins loaded)."""
    return REGISTRIES[registry][1]()


def describe_registry(registry: str) -> str:
    """The key's limits in words: "a registered policy loss (ppo_clip, cispo)"."""
    word, _ = REGISTRIES[registry]
    return f"{word} ({', '.join(registered_names(registry))})"
