"""Scoring a generation batch with the user's reward, bounded and checked.

The reward is user code: it may hang, raise, or return something that is not a
number. It runs in a daemon thread bounded by ``timeouts.reward_s`` (a thread cannot be
killed, but the run stops and the process exits without waiting for it), and every
value is converted and checked in that same thread, before any advantage is computed:
converting is user code too (a ``__float__`` may hang, ``float(10**400)`` and
``float(Decimal('sNaN'))`` raise). Accepted: Python numbers (``bool`` as 0 or 1),
``Decimal`` and ``Fraction``, numpy and torch scalars, and arrays of exactly one value.
A string, None, a list, an array of several values, NaN, infinity or a magnitude
float32 cannot hold stops the run with a :class:`RewardError` naming the reward, the
prompt and the completion.
"""

from __future__ import annotations

import decimal
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from art_hydra import workers
from art_hydra.config.bounds import FLOAT32_MAX
from art_hydra.errors import RewardError
from art_hydra.tasks.examples import Example


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


def score_batch(
    reward: Callable[[str, str, str | None], Any],
    name: str,
    pairs: Sequence[tuple[Example, str]],
    timeout_s: float,
) -> list[float]:
    """Each ``(example, completion)`` scored by ``reward``, within ``timeout_s`` in all;
    calling, converting and describing a failure all run in the bounded thread (each may
    run user code: a ``__float__``, an exception's ``__str__``)."""
    progress = {"index": 0, "doing": "scoring"}
    scores: list[float] = []
    #: (why, the exception) of the first failure, described in the worker.
    failure: list[tuple[str, BaseException | None]] = []

    def work() -> None:
        try:
            for index, (example, completion) in enumerate(pairs):
                progress.update(index=index, doing="scoring")
                value = reward(prompt=example.prompt, completion=completion, answer=example.answer)
                progress["doing"] = "converting the value it returned for"
                number = _number(value)
                if isinstance(number, str):
                    failure.append((number, None))
                    return
                scores.append(number)
        except BaseException as exc:
            verb = "raised" if progress["doing"] == "scoring" else "returned a value that raised"
            failure.append((f"{verb} {type(exc).__name__}: {exc}", exc))

    worker = workers.start(work, "reward")
    worker.join(timeout_s)
    if worker.is_alive():
        example, completion = pairs[progress["index"]]
        raise RewardError(
            f"the reward {name} did not finish scoring a batch of {len(pairs)} completions "
            f"within {timeout_s:g}s (timeouts.reward_s); it was {progress['doing']} "
            f"{_where(example, completion)}."
        )
    if failure:
        why, exc = failure[0]
        example, completion = pairs[progress["index"]]
        raise RewardError(
            f"the reward {name} {why} for {_where(example, completion)}"
            + (
                "; rewards must be finite numbers (the advantages are computed from them)."
                if exc is None
                else "."
            )
        ) from exc
    return scores
