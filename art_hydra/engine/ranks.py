"""The rank coordinator: everything a run's loop does across ranks, behind one interface.

A training step on several ranks needs a few agreements: wait for every rank's inputs
(the step barrier), divide each rank's loss by the global token count (normalise),
combine the step's metrics and agree on a stop, gather the producers' states for a
checkpoint and wait for rank 0 to write it. A single process needs none of them. The
loop calls the same methods either way, so it has no rank branches:

* :class:`SingleProcess` does nothing and returns its input unchanged; it imports
  no ``torch.distributed`` and calls no collective;
* :class:`ProcessGroup` runs each agreement as one control collective (see
  :mod:`art_hydra.engine.distributed`), every rank in the same order, each bounded by its own
  timeout, and turns a failure into a :class:`~art_hydra.engine.distributed.RankFailure` that
  names what the ranks were doing and the ranks that did not answer.

:func:`coordinator_for` picks one, once per run, from the process's world.
"""

from __future__ import annotations

from typing import Any, Protocol

from art_hydra.engine import distributed
from art_hydra.engine.distributed import World


class RankCoordinator(Protocol):
    """What the loop asks of the ranks; both implementations answer all of it."""

    world: World

    @property
    def writes_records(self) -> bool:
        """Whether this process writes the run folder's records (metrics, checkpoints,
        the run config) and speaks for the run (its start summary and closing lines):
        rank 0, or the one process."""
        ...

    @property
    def keeps_last_step(self) -> bool:
        """Whether a step that fails after a stop request may still save the last
        finished step from a snapshot taken after it (one process: ranks share none)."""
        ...

    def stopping(self, stop: Any) -> bool:
        """Whether to stop before the next step."""
        ...

    def inputs_barrier(self, what: str) -> None:
        """Wait for every rank to have made its step's inputs."""
        ...

    def normalise(self, inputs: list[Any]) -> None:
        """Set each input's loss denominator to the global one."""
        ...

    def combine(self, result: Any, last: dict[str, Any], stop: Any) -> dict[str, Any]:
        """The step's metrics over every rank, and one stop decision for all."""
        ...

    def gather_producer_states(self, producer: Any) -> list[Any] | None:
        """Every rank's producer state, in rank order (None: one process, whose
        checkpoint takes its producer's state itself)."""
        ...

    def checkpoint_barrier(self, step: int) -> None:
        """Wait for rank 0's write of checkpoint ``step``."""
        ...


class SingleProcess:
    """One process: nothing to agree on. Every method does nothing or returns its input."""

    def __init__(self, world: World) -> None:
        self.world = world

    @property
    def writes_records(self) -> bool:
        return True

    @property
    def keeps_last_step(self) -> bool:
        return True

    def stopping(self, stop: Any) -> bool:
        """A signal seen is a stop."""
        return bool(stop.requested)

    def inputs_barrier(self, what: str) -> None:
        pass

    def normalise(self, inputs: list[Any]) -> None:
        pass  # the producer's own denominator is already the step's

    def combine(self, result: Any, last: dict[str, Any], stop: Any) -> dict[str, Any]:
        return last

    def gather_producer_states(self, producer: Any) -> list[Any] | None:
        return None

    def checkpoint_barrier(self, step: int) -> None:
        pass


class ProcessGroup:
    """Several ranks in one process group: each agreement is a control collective.

    ``timeout_s`` is ``distributed.timeout_s``, the bound of one collective; the step
    barrier waits longer by ``inputs_s`` (the slowest rank's sampling and scoring, bounded
    by their own timeouts) and the checkpoint barrier by ``checkpoint_s`` (rank 0's
    write)."""

    def __init__(self, world: World, timeout_s: float, inputs_s: float, checkpoint_s: float):
        self.world = world
        self.timeout_s, self.inputs_s, self.checkpoint_s = timeout_s, inputs_s, checkpoint_s

    @property
    def writes_records(self) -> bool:
        return self.world.is_main

    @property
    def keeps_last_step(self) -> bool:
        return False

    def stopping(self, stop: Any) -> bool:
        """Only what the ranks agreed at the last step's combine (a signal that lands on
        one rank after it is taken up at the next), so every rank stops at the same step."""
        return bool(stop.agreed)

    def inputs_barrier(self, what: str) -> None:
        self._across(what, distributed.barrier, self.inputs_s + self.timeout_s)

    def normalise(self, inputs: list[Any]) -> None:
        """Each rank's loss divides by the global token count over the ranks (times the
        ranks, since DDP averages): the step then equals one process on the global batch.

        The local count is the producer's own denominator, which every input of a step
        carries (set once, by ``packing.one_step``): the step's tokens (SFT's accumulated
        micro-batches, an RL mini-batch), or, with rl.steps_per_generation > 1, the
        generation batch's tokens divided by it; summed over the ranks that is TRL's
        ``num_items_in_batch`` rescaled the same way."""
        local = inputs[0].step_loss_tokens
        (total,) = self._across("counting the step's tokens", distributed.all_sum, [local])
        for item in inputs:
            item.step_loss_tokens = total / self.world.size

    def combine(self, result: Any, last: dict[str, Any], stop: Any) -> dict[str, Any]:
        """The step's metrics over every rank (rewards gathered from all ranks), and one
        stop decision for all: a signal seen by any rank stops every rank at this step."""
        n = float(result.info.get("completions", 0.0))
        tokens = float(result.loss_tokens)
        mean, std = last["reward_mean"] or 0.0, last["reward_std"] or 0.0
        sums = self._across(
            "combining the step's metrics",
            distributed.all_sum,
            [
                n,
                n * mean,
                n * (std**2 + mean**2),
                last["zero_std_groups"] or 0.0,
                n * (last["completion_length"] or 0.0),
                last["loss"],
                tokens,
                tokens * last["kl"],
                tokens * last["entropy"],
                tokens * last["clip_fraction"],
                float(result.trained_tokens),
                float(result.trained_tokens) / max(last["real_token_share"], 1e-12),
                1.0 if stop.requested else 0.0,
            ],
        )
        combined = _combined_metrics(last, sums, self.world.size)
        stop.agreed = bool(sums[12])  # every rank stops at this step if any was signalled
        combined.update(self._combine_rewards(last))
        combined.update(self._combine_stats(result))
        combined.update(self._combine_agent(last, n))
        return combined

    def _combine_agent(self, last: dict[str, Any], n: float) -> dict[str, float]:
        """Multi-turn tool rollouts' metrics over every rank: per-trajectory means
        weighted by each rank's trajectories, tool errors and time summed (every rank
        has an agent or none has)."""
        if "tool_calls_mean" not in last:
            return {}
        means = ("tool_calls_mean", "turns_mean", "masked_token_share")
        totals = ("tool_errors", "tool_time_s")
        sums = self._across(
            "combining the tool metrics",
            distributed.all_sum,
            [
                n,
                *(n * float(last[k] or 0.0) for k in means),
                *(float(last[k] or 0.0) for k in totals),
            ],
        )
        found = {k: v / max(sums[0], 1.0) for k, v in zip(means, sums[1:4], strict=True)}
        found.update(zip(totals, sums[4:], strict=True))
        return found

    def _combine_stats(self, result: Any) -> dict[str, float]:
        """The loss's further statistics over every rank: means weighted by each rank's
        loss tokens, maxima as the largest (every rank reports the same keys)."""
        from art_hydra.engine.trainer import is_max_stat

        means = sorted(k for k in result.stats if not is_max_stat(k))
        maxima = sorted(k for k in result.stats if is_max_stat(k))
        tokens = float(result.loss_tokens)
        found: dict[str, float] = {}
        if means:
            sums = self._across(
                "combining the loss statistics",
                distributed.all_sum,
                [tokens, *(tokens * result.stats[k] for k in means)],
            )
            found.update({k: v / max(sums[0], 1.0) for k, v in zip(means, sums[1:], strict=True)})
        if maxima:
            largest = self._across(
                "combining the loss maxima",
                distributed.all_max,
                [result.stats[k] for k in maxima],
            )
            found.update(zip(maxima, largest, strict=True))
        return found

    def _combine_rewards(self, last: dict[str, Any]) -> dict[str, Any]:
        """Each reward's ``reward/<name>/mean``, ``/std`` and ``/count`` over every rank,
        from the count of completions it applied to on each (every rank has the same
        rewards)."""
        names = sorted(
            k[: -len("/count")] for k in last if k.startswith("reward/") and k.endswith("/count")
        )
        parts: list[float] = []
        for name in names:
            n = float(last[f"{name}/count"] or 0.0)
            mean, std = last[f"{name}/mean"] or 0.0, last[f"{name}/std"] or 0.0
            parts += [n, n * mean, n * (std**2 + mean**2)]
        if not parts:
            return {}
        sums = self._across("combining the rewards' metrics", distributed.all_sum, parts)
        found: dict[str, Any] = {}
        for i, name in enumerate(names):
            n, total, squares = sums[3 * i : 3 * i + 3]
            mean = total / n if n else None
            found[f"{name}/count"] = n
            found[f"{name}/mean"] = mean
            spread = max(squares / n - mean**2, 0.0) ** 0.5 if mean is not None else None
            found[f"{name}/std"] = spread
        return found

    def gather_producer_states(self, producer: Any) -> list[Any] | None:
        return self._across(
            "gathering the producers' states", distributed.gather_objects, producer.state_dict()
        )

    def checkpoint_barrier(self, step: int) -> None:
        """The other ranks wait for rank 0's write (named by the barrier if it dies)."""
        self._across(
            f"waiting for checkpoint step {step}",
            distributed.barrier,
            self.checkpoint_s + self.timeout_s,
        )

    def _across(self, what: str, collective: Any, *args: Any) -> Any:
        """``collective(world, *args)``, one call every rank makes in the same order (a
        sum, a gather, a barrier); its failure names the ranks that did not answer
        (``what``: what they were doing)."""
        try:
            return collective(self.world, *args)
        except Exception as exc:
            raise distributed.failure(self.world, what, exc, self.timeout_s) from exc


def _combined_metrics(last: dict[str, Any], sums: list[float], size: int) -> dict[str, Any]:
    """The step's metric line from the ranks' sums (see :meth:`ProcessGroup.combine` for
    their order); a metric this step does not have (None: SFT's rewards) stays None."""
    total_n, tokens_all = max(sums[0], 1.0), max(sums[6], 1.0)
    reward_mean = sums[1] / total_n
    combined = dict(last)
    combined.update(
        reward_mean=reward_mean if last["reward_mean"] is not None else None,
        reward_std=max(sums[2] / total_n - reward_mean**2, 0.0) ** 0.5
        if last["reward_std"] is not None
        else None,
        zero_std_groups=sums[3] if last["zero_std_groups"] is not None else None,
        completion_length=sums[4] / total_n if last["completion_length"] is not None else None,
        loss=sums[5] / size,
        kl=sums[7] / tokens_all,
        entropy=sums[8] / tokens_all,
        clip_fraction=sums[9] / tokens_all,
        real_token_share=sums[10] / max(sums[11], 1.0),
        tokens_per_s=sums[10] / last["step_time_s"],
    )
    return combined


def coordinator_for(
    world: World, timeout_s: float, inputs_s: float, checkpoint_s: float
) -> RankCoordinator:
    """The coordinator for this process's world, built once per run: a world of one
    gets :class:`SingleProcess`. ``timeout_s``: ``distributed.timeout_s``; ``inputs_s``:
    the bound on making a step's inputs; ``checkpoint_s``: ``timeouts.checkpoint_s``."""
    if not world.enabled:
        return SingleProcess(world)
    return ProcessGroup(world, timeout_s, inputs_s, checkpoint_s)
