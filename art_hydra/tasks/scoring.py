"""Scoring a generation batch with the user's rewards, bounded and checked.

Each reward (:mod:`art_hydra.tasks.reward_set`: per sample, or batched as TRL calls
them) is user code: it may hang, raise, or return something that is not a
number. It runs in a daemon thread bounded by ``timeouts.reward_s`` (a thread cannot be
killed, but the run stops and the process exits without waiting for it), and every
value is converted and checked in that same thread, before any advantage is computed:
converting is user code too (a ``__float__`` may hang, ``float(10**400)`` and
``float(Decimal('sNaN'))`` raise). Accepted: Python numbers (``bool`` as 0 or 1),
``Decimal`` and ``Fraction``, numpy and torch scalars, and arrays of exactly one value.
A string, None, a list, an array of several values, NaN, infinity or a magnitude
float32 cannot hold stops the run with a :class:`RewardError` naming the reward, the
prompt and the completion. A batched reward returns a list (or a one-dimensional array)
of exactly one value per completion, each a number as above or None (the reward does
not apply to that completion); another count stops the run naming the reward.
All the rewards of a batch share one bound, ``timeouts.reward_s``.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from art_hydra import workers
from art_hydra.config.bounds import FLOAT32_MAX
from art_hydra.errors import RewardError, raised
from art_hydra.tasks.examples import Example
from art_hydra.tasks.reward_set import (
    Calling,
    RewardSpec,
    batched_kwargs,
    calling,
    combine,
    per_sample_kwargs,
)


def _where(example: Example, completion: str) -> str:
    def cut(text: str) -> str:
        return repr(text if len(text) <= 200 else text[:200] + "...")

    return f"prompt {cut(example.prompt)} and completion {cut(completion)}"


def _size(value: Any) -> int | None:
    """How many values an array holds (numpy ``.size``, torch ``.numel()``); None for
    anything that is not an array."""
    numel = getattr(value, "numel", None)
    if callable(numel):
        return int(numel())
    size = getattr(value, "size", None)
    return size if isinstance(size, int) and hasattr(value, "item") else None


def _shown(value: Any) -> str:
    """``value`` for a message, without calling its ``__repr__`` unless it is a builtin
    (a user's object may hang or raise there too)."""
    if isinstance(value, (str, bytes)):
        return repr(value if len(value) <= 80 else value[:80]) + f" ({type(value).__name__})"
    if value is None or isinstance(value, (float, decimal.Decimal)):
        return f"{value!r} ({type(value).__name__})"
    return f"a value of type {type(value).__qualname__}"


def _number(value: Any) -> float | str:
    """``value`` as a finite float, or why it is not one (in words for the message)."""
    size = _size(value)
    if size is not None and size != 1:
        return f"returned an array of {size} values ({type(value).__qualname__}), not one number"
    if size == 1:
        value = value.item()
    if isinstance(value, (str, bytes, bytearray)) or value is None:
        return f"returned {_shown(value)}, not a number"
    if isinstance(value, (list, tuple, dict, set)):
        count = len(value)
        return (
            f"returned a {type(value).__name__} of {count} value{'s' * (count != 1)}, not a number"
        )
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        return f"returned {_shown(value)}, not a finite number"
    if isinstance(value, int) and abs(value) > FLOAT32_MAX:
        return (
            f"returned an integer of {value.bit_length()} bits, beyond what float32 can hold "
            f"({FLOAT32_MAX:.3g})"
        )
    if not (isinstance(value, numbers.Real) or hasattr(type(value), "__float__")):
        return f"returned {_shown(value)}, not a number"
    try:
        number = float(value)
    except (ArithmeticError, ValueError, TypeError) as exc:
        return f"returned {_shown(value)}, which has no float value ({type(exc).__name__}: {exc})"
    if not isinstance(number, float):
        return f"returned {_shown(value)}, whose __float__ gave a {type(number).__name__}"
    if not math.isfinite(number):
        as_float = "" if isinstance(value, float) else f" ({_shown(value)} as a float)"
        return f"returned {number}{as_float}, not a finite number"
    if abs(number) > FLOAT32_MAX:
        return f"returned {number:g}, beyond what float32 can hold ({FLOAT32_MAX:.3g})"
    return number


@dataclass(frozen=True)
class BoundReward:
    """A resolved reward: its function, how it is called, and its place in the config."""

    fn: Any
    spec: RewardSpec
    calling: Calling

    @property
    def label(self) -> str:
        """The reward as messages name it: its path, and its config key when it is one of
        a list (the one reward of ``task.reward._target_`` is named by its path alone)."""
        if self.spec.key.startswith("task.rewards."):
            return f"{self.spec.target} ({self.spec.key})"
        return self.spec.target


def bind(fn: Any, spec: RewardSpec) -> BoundReward:
    """``fn`` with how it is called; raises :class:`RewardError` when it cannot be (the
    pre-flight reports the same as a problem before a run starts)."""
    how = calling(fn)
    if isinstance(how, str):
        raise RewardError(f"the reward {spec.target} ({spec.key}) {how}")
    return BoundReward(fn, spec, how)


@dataclass
class Scores:
    """A batch's rewards: the weighted totals, and each reward's values (None: it does
    not apply to that completion)."""

    totals: list[float]
    per_reward: list[list[float | None]]
    #: The rewards, in the order of ``per_reward``.
    rewards: list[BoundReward]
    #: Completions no reward applied to (their total is 0, as in TRL).
    none_all: int = 0


def _values(value: Any, count: int) -> list[float | None] | tuple[int | None, str]:
    """A batched reward's result as one float or None per completion, or (the index it
    went wrong at, or None for the whole result; why)."""
    if _size(value) is not None and hasattr(value, "tolist"):
        value = value.tolist()  # a numpy or torch vector
    if not isinstance(value, (list, tuple)):
        return None, (
            f"returned {_shown(value)}, not a list of {count} values (a batched reward returns "
            "one number or None per completion)"
        )
    if len(value) != count:
        got = f"{len(value)} value{'s' * (len(value) != 1)}"
        return None, (
            f"returned {got} for {count} completions (a batched reward returns exactly one "
            "number or None per completion, in order)"
        )
    out: list[float | None] = []
    for index, item in enumerate(value):
        number = None if item is None else _number(item)
        if isinstance(number, str):
            return index, number
        out.append(number)
    return out


def score_rewards(
    rewards: Sequence[BoundReward],
    pairs: Sequence[tuple[Example, str]],
    timeout_s: float,
    completion_ids: Sequence[Sequence[int]] | None = None,
    global_step: int = 0,
    agent: dict[str, list[Any]] | None = None,
) -> Scores:
    """Each ``(example, completion)`` scored by every reward, within ``timeout_s`` for
    them all; calling, converting and describing a failure all run in the bounded thread
    (each may run user code: a ``__float__``, an exception's ``__str__``). ``agent``:
    a multi-turn rollout's lists for batched rewards (``environments``, ``completions``
    as messages; see :func:`~art_hydra.tasks.reward_set.batched_kwargs`); a per-sample
    reward gets each one's entry as ``environment`` and ``completion_messages``."""
    progress: dict[str, Any] = {"reward": 0, "index": None, "doing": "scoring"}
    per_reward: list[list[float | None]] = []
    #: (why, the exception) of the first failure, described in the worker.
    failure: list[tuple[str, BaseException | None]] = []

    def work() -> None:
        try:
            for number, reward in enumerate(rewards):
                progress.update(reward=number, index=None, doing="scoring")
                values = (
                    _batched(reward, pairs, completion_ids, global_step, progress, agent)
                    if reward.calling.batched
                    else _per_sample(reward, pairs, progress, agent)
                )
                if isinstance(values, str):
                    failure.append((values, None))
                    return
                per_reward.append(values)
        except BaseException as exc:
            verb = "raised" if progress["doing"] == "scoring" else "returned a value that raised"
            failure.append((f"{verb} {raised(exc)}", exc))

    worker = workers.start(work, "reward")
    worker.join(timeout_s)
    if worker.is_alive():
        reward = rewards[progress["reward"]]
        raise RewardError(
            f"the reward {reward.label} did not finish scoring a batch of {len(pairs)} "
            f"completions within {timeout_s:g}s (timeouts.reward_s); it was "
            f"{progress['doing']} {_at(pairs, progress['index'])}."
        )
    if failure:
        why, exc = failure[0]
        reward = rewards[progress["reward"]]
        raise RewardError(
            f"the reward {reward.label} {why} for {_at(pairs, progress['index'])}"
            + (
                "; rewards must be finite numbers (the advantages are computed from them)."
                if exc is None
                else "."
            )
        ) from exc
    weights = [r.spec.weight for r in rewards]
    none_all = sum(all(values[i] is None for values in per_reward) for i in range(len(pairs)))
    return Scores(combine(per_reward, weights), per_reward, list(rewards), none_all)


def _at(pairs: Sequence[tuple[Example, str]], index: int | None) -> str:
    if index is None:
        return f"the batch of {len(pairs)} completions that begins with {_where(*pairs[0])}"
    example, completion = pairs[index]
    return _where(example, completion)


#: A multi-turn rollout's batched arguments and each one's per-sample name.
_SINGULAR = {"environments": "environment", "completions": "completion_messages"}


def _per_sample(
    reward: BoundReward,
    pairs: Sequence[tuple[Example, str]],
    progress: dict[str, Any],
    agent: dict[str, list[Any]] | None = None,
) -> list[float | None] | str:
    values: list[float | None] = []
    for index, (example, completion) in enumerate(pairs):
        progress.update(index=index, doing="scoring")
        extra = {_SINGULAR.get(k, k): v[index] for k, v in (agent or {}).items()}
        value = reward.fn(**reward.calling.pick(per_sample_kwargs(example, completion, extra)))
        progress["doing"] = "converting the value it returned for"
        number = _number(value)
        if isinstance(number, str):
            return number
        values.append(number)
    return values


def _batched(
    reward: BoundReward,
    pairs: Sequence[tuple[Example, str]],
    completion_ids: Sequence[Sequence[int]] | None,
    global_step: int,
    progress: dict[str, Any],
    agent: dict[str, list[Any]] | None = None,
) -> list[float | None] | str:
    kwargs = batched_kwargs(
        [ex for ex, _ in pairs], [c for _, c in pairs], completion_ids, global_step, agent
    )
    value = reward.fn(**reward.calling.pick(kwargs))
    progress["doing"] = "converting the values it returned for"
    values = _values(value, len(pairs))
    if isinstance(values, tuple):
        index, why = values
        progress["index"] = index
        return why if index is None else f"{why} (value #{index})"
    return values


def score_batch(
    reward: Callable[..., Any],
    name: str,
    pairs: Sequence[tuple[Example, str]],
    timeout_s: float,
) -> list[float]:
    """The scores of one per-sample ``reward`` named ``name`` (see :func:`score_rewards`)."""
    spec = RewardSpec(name, name, 1.0, name)
    how = calling(reward)
    bound = BoundReward(
        reward,
        spec,
        how if isinstance(how, Calling) else Calling(False, frozenset(), True, ()),
    )
    return score_rewards([bound], pairs, timeout_s).totals
