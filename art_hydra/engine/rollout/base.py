"""The rollout interface: what the producer, evaluation and ``art-hydra generate`` ask of
whatever generates, whether the built-in sampler or an inference engine.

Token ids go in and come out (text is never re-tokenized between the engine and the
trainer), with each sampled token's logprob under the distribution the trainer computes
(:func:`~art_hydra.engine.rl.sampling.logprob_logits`), so the ``sampling_mismatch``
metrics and the importance-sampling correction compare like with like. Each request
carries its own stop ids and token budget, which a multi-turn rollout (a tool call, then
its result, then the next turn) sets per turn.

An engine holds its own copy of the weights or samples from the policy itself
(``in_process_policy``); :meth:`RolloutEngine.sync_weights` is called after every
optimizer step, while neither side computes, so each rollout samples from the current
policy. A new engine is one class implementing this protocol and one
``register_rollout_engine`` line (:mod:`art_hydra.config.rollout_engines`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

    from art_hydra.config.schema import RunConfig
    from art_hydra.engine.rl.sampling import SamplingSettings

#: Why a completion ended: a stop id was sampled (it ends the completion), or the
#: request's token budget ran out.
STOP, LENGTH = "stop", "length"


@dataclass(frozen=True)
class Request:
    """One completion to sample: the prompt's ids, the most tokens to add, and the ids
    that end it (sampled and kept as its last token)."""

    prompt_ids: tuple[int, ...]
    max_tokens: int
    stop_ids: tuple[int, ...]


@dataclass
class Completion:
    """A sampled completion: its ids (ending with the stop id when one ended it), the
    logprob of each when it was drawn, and why it ended (:data:`STOP` or :data:`LENGTH`)."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


def finish_reason(tokens: list[int], stop_ids: tuple[int, ...]) -> str:
    """:data:`STOP` when the completion ends with one of ``stop_ids``, else :data:`LENGTH`."""
    return STOP if tokens and tokens[-1] in stop_ids else LENGTH


class RolloutEngine(Protocol):
    """What every rollout engine does (see the module doc). Built as
    ``Engine(loaded, run, world)``."""

    def generate(
        self,
        requests: Sequence[Request],
        settings: SamplingSettings,
        generator: torch.Generator,
        timeout_s: float | None = None,
    ) -> list[Completion]:
        """One completion per request, in order. Random draws come from ``generator``
        (the caller's stream, kept in its checkpoints), so a resumed run draws alike."""

    def sync_weights(self) -> None:
        """Take the policy's weights as they are now (after an optimizer step or a
        resume): the next :meth:`generate` samples from them."""

    def sleep(self) -> None:
        """Free what the engine holds while the trainer steps (where it can)."""

    def wake(self) -> None:
        """Undo :meth:`sleep` (a no-op when awake)."""

    def close(self) -> None:
        """Release the engine (its memory, processes and temporary files)."""

    def describe(self) -> str:
        """One line for the run's log: what generates, and how its weights are kept."""


def build_rollout_engine(loaded: Any, run: RunConfig, world: Any = None) -> Any:
    """The engine ``rollout.engine`` names, for the policy ``loaded`` (built once, after
    the model loads)."""
    from art_hydra.config.rollout_engines import get_rollout_engine

    declared = get_rollout_engine(run.rollout.engine)
    if declared is None:  # validation refuses this first; a plugin may vanish meanwhile
        raise ValueError(f"rollout.engine={run.rollout.engine!r} is not a registered engine")
    return declared.builder()(loaded, run, world)
