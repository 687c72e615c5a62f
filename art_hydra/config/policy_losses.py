"""The policy-loss registry: the names ``rl.loss_type`` accepts and what each loss reads.

A policy loss is one function, registered where it is defined with
:func:`register_policy_loss` (re-exported by :mod:`art_hydra.engine.rl.losses`, where the
built-in ``ppo_clip`` and ``cispo`` register the same way)::

    @register_policy_loss("my_loss", settings=("epsilon",), help="...")
    def my_loss(ratio, logprobs, advantages, settings):
        return per_token, {"clip_fraction": clipped_tokens}

The registry holds each loss's metadata (the ``rl.*`` settings it honours, those it
requires, the further statistics it logs) beside the function, so validation, the
key table (docs/config-keys.md) and the JSON Schema read the choices and their settings from here,
without a branch per loss and without importing torch: the modules that register
losses import torch only inside the functions.

Losses come from three places, loaded once per process before the first lookup:
art_hydra's own (:data:`BUILTIN_MODULES`), installed packages through the
``art_hydra.policy_losses`` entry-point group (a module whose import registers some,
as for validators), and any module a launcher script imported before calling
``art_hydra.commands.cli.main()`` (its decorators ran at import).

This module is on the compose/validate path: it imports nothing heavier than the
standard library.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_hydra.config.plugin_registry import PluginRegistry

#: Entry-point group through which other packages contribute policy losses.
ENTRY_POINT_GROUP = "art_hydra.policy_losses"

#: art_hydra's own loss modules, loaded as a plugin would be (their import is torch-free).
BUILTIN_MODULES = ("art_hydra.engine.rl.losses",)

#: The ``rl.*`` settings a loss may declare that it honours or requires.
LOSS_SETTINGS = ("epsilon", "epsilon_high")

#: ``rl.loss_aggregation``'s values, TRL 1.16's ``loss_type`` names for its normalisations
#: -> what one optimizer step's masked per-token terms (policy and KL) are averaged by.
#: The engine (:func:`art_hydra.engine.rl.losses.policy_loss`) implements each; kept
#: here, torch-free, so validation, the key table and the TRL-name fixes read one list.
#: ``dapo`` (the first) is the default and what art_hydra did before the key existed.
LOSS_AGGREGATIONS: dict[str, str] = {
    "dapo": "the sum over the step's tokens / the generation batch's trained tokens over "
    "every rank / the ranks / rl.steps_per_generation (TRL's num_items_in_batch rescaled "
    "to one step): every token of a generation batch weighs alike",
    "grpo": "each completion's token mean, then the mean over the rank's completions "
    "(a short completion's tokens weigh more)",
    "bnpo": "the sum over the rank's trained tokens / their count (each optimizer step's "
    "own token mean); TRL's bnpo under trainer.gradient_accumulation_steps=1 (TRL averages "
    "each micro-batch's token mean when it accumulates)",
    "dr_grpo": "the sum / (the rank's completions x rl.max_completion_length), a constant "
    "per step: no length bias (Dr. GRPO)",
}


@dataclass(frozen=True)
class PolicyLoss:
    """One registered loss: its function and what it reads from the ``rl`` section.

    ``fn(ratio, logprobs, advantages, settings)`` returns the per-token policy term
    (before the importance weight, the KL term and the mask) and a dict of boolean
    per-token tensors, each logged as the fraction of trained tokens it marks
    (``clip_fraction`` is logged as 0 when absent). ``settings`` is
    :class:`art_hydra.engine.rl.losses.PolicyLossSettings`.
    """

    name: str
    fn: Callable[..., Any]
    #: ``rl.*`` keys (of :data:`LOSS_SETTINGS`) the loss reads; setting another is inert.
    settings: tuple[str, ...]
    #: ``rl.*`` keys that must not be null with this loss -> the value the fix offers.
    requires: dict[str, Any]
    #: Why a required key is needed, in words (shown when it is null).
    why: dict[str, str]
    #: Statistics it logs beside ``kl`` and ``clip_fraction``.
    metrics: tuple[str, ...]
    help: str
    module: str


REGISTRY: PluginRegistry[PolicyLoss] = PluginRegistry(
    ENTRY_POINT_GROUP, BUILTIN_MODULES, "policy loss"
)
_losses = REGISTRY.registered


def register_policy_loss(
    name: str,
    *,
    settings: tuple[str, ...] = (),
    requires: dict[str, Any] | None = None,
    why: dict[str, str] | None = None,
    metrics: tuple[str, ...] = (),
    help: str = "",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function as the policy loss ``rl.loss_type=name``.

    ``settings``: the ``rl.*`` keys (of :data:`LOSS_SETTINGS`) it reads, others being
    reported inert; ``requires``: keys that must be set, each with the value the fix
    offers (``why`` says why, per key); ``metrics``: the further statistics it logs;
    ``help``: one line for reports (default: the docstring's first sentence)."""
    requires = dict(requires or {})
    unknown = [s for s in (*settings, *requires) if s not in LOSS_SETTINGS]
    if unknown:
        raise ValueError(
            f"policy loss {name!r} declares {unknown}; a loss reads only {LOSS_SETTINGS}"
        )

    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        module = getattr(fn, "__module__", "")
        old = _losses.get(name)
        if old is not None and (old.module, old.fn.__qualname__) != (module, fn.__qualname__):
            raise ValueError(
                f"policy loss {name!r} is registered twice: by {old.module}.{old.fn.__qualname__} "
                f"and by {module}.{fn.__qualname__}"
            )
        doc = help or " ".join((fn.__doc__ or "").split()).partition(". ")[0]
        _losses[name] = PolicyLoss(
            name, fn, tuple(settings), requires, dict(why or {}), tuple(metrics), doc, module
        )
        return fn

    return register


def policy_losses() -> dict[str, PolicyLoss]:
    """Every registered loss by name (built-ins first, then plugins, in load order)."""
    return REGISTRY.entries()


def get_policy_loss(name: Any) -> PolicyLoss | None:
    """The loss registered as ``name`` (a string, or an Enum by its name), or None."""
    return REGISTRY.get(name)
