"""``rollout.engine=torch``: the built-in sampler (:func:`art_hydra.engine.rl.sampling.sample`)
behind the rollout interface.

It samples from the policy object itself, in the trainer's precision, so its logprobs
differ from the training forward's by kernels alone and there is nothing to sync.
Under ``rl.overlap_rollouts`` it samples from a frozen copy of the policy on the rollout
thread while the trainer trains, and :meth:`TorchRollout.sync_weights` copies the
trained weights into it after every optimizer step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from art_hydra.engine.rl.sampling import SamplingSettings, sample
from art_hydra.engine.rollout.base import Completion, Request, finish_reason
from art_hydra.errors import InvalidDistributionError

if TYPE_CHECKING:
    from art_hydra.config.schema import RunConfig


class TorchRollout:
    """The built-in sampler on the policy (or, overlapped, on its copy)."""

    def __init__(self, loaded: Any, run: RunConfig, world: Any = None) -> None:
        self.loaded = loaded
        overlap = run.algorithm.name.name == "rl" and run.rl.overlap_rollouts
        #: The copy sampled from while the trainer trains (rl.overlap_rollouts), or the
        #: whole copy of a sharded policy (see :mod:`art_hydra.engine.sharding`), or None:
        #: the policy itself.
        self.copy: Any = loaded.frozen_copy() if overlap or loaded.sharding else None

    @classmethod
    def on(cls, loaded: Any) -> TorchRollout:
        """The sampler on the policy itself (evaluation, ``art-hydra generate``); on a
        whole copy of it where the policy is sharded (a collective: every rank makes it,
        and :meth:`sync_weights` refreshes it)."""
        engine = cls.__new__(cls)
        engine.loaded = loaded
        engine.copy = loaded.frozen_copy() if loaded.sharding is not None else None
        return engine

    @property
    def model(self) -> Any:
        """The model completions are sampled from."""
        return self.copy if self.copy is not None else self.loaded.model

    def describe(self) -> str:
        where = "the policy"
        if self.copy is not None:
            whole = "a whole (unsharded) copy" if self.loaded.sharding else "a copy"
            where = f"{whole} of the policy, refreshed after every step"
        return f"rollouts: the built-in torch sampler on {where}"

    def generate(
        self,
        requests: Sequence[Request],
        settings: SamplingSettings,
        generator: torch.Generator,
        timeout_s: float | None = None,
    ) -> list[Completion]:
        """Requests sharing a budget and stop ids are sampled as one batch (all of them,
        for single-turn rollouts), so the sampler's speed is what it was."""
        from art_hydra.engine.trainer import eval_mode

        batches: dict[tuple[int, tuple[int, ...]], list[int]] = {}
        for index, request in enumerate(requests):
            batches.setdefault((request.max_tokens, request.stop_ids), []).append(index)
        found: list[Completion | None] = [None] * len(requests)
        pad = self.loaded.tokenizer.pad_token_id
        with eval_mode(self.model) as model, self.loaded.compute_precision():
            for (budget, stops), indices in batches.items():
                prompts = [list(requests[i].prompt_ids) for i in indices]
                try:
                    tokens, logprobs = sample(
                        model,
                        prompts,
                        budget,
                        settings,
                        stops,
                        pad,
                        generator,
                        left_padding=self.loaded.layout.left_padding,
                        timeout_s=timeout_s,
                    )
                except InvalidDistributionError as exc:
                    if len(batches) == 1:
                        raise
                    raise exc.remapped(indices, len(requests)) from None
                for i, row, values in zip(indices, tokens, logprobs, strict=True):
                    found[i] = Completion(row, values, finish_reason(row, stops))
        return [c for c in found if c is not None]

    @torch.no_grad()
    def sync_weights(self) -> None:
        """Copy the trained weights into the copy (gathered from their shards: a
        collective, at the same point on every rank); frozen weights never change and
        are skipped (nothing to do on the policy itself)."""
        if self.copy is None:
            return
        from art_hydra.engine.sharding import full

        policy = dict(self.loaded.model.named_parameters())
        for name, param in self.copy.named_parameters():
            source = policy[name]
            if source.requires_grad:
                param.copy_(full(source))

    def sleep(self) -> None:
        """Nothing to free: the policy is the trainer's own."""

    def wake(self) -> None:
        """Nothing was freed."""

    def close(self) -> None:
        self.copy = None
