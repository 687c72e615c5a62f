"""Scoring a generation batch with the user's reward, bounded and checked.

The reward is user code: it may hang, raise, or return something that is not a
number. It runs in a daemon thread bounded by ``timeouts.reward_s`` (a thread cannot be
killed, but the run stops and the process exits without waiting for it), and every
value is checked before any advantage is computed: a string, None, NaN, infinity or a
magnitude float32 cannot hold stops the run with a :class:`RewardError` naming the
reward, the prompt and the completion.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from art_hydra import workers
from art_hydra.errors import RewardError
from art_hydra.tasks.examples import Example

#: The largest magnitude a reward may have: it becomes part of a float32 tensor.
LARGEST = 3.4028234663852886e38


def _where(example: Example, completion: str) -> str:
    def cut(text: str) -> str:
        return repr(text if len(text) <= 200 else text[:200] + "...")

    return f"prompt {cut(example.prompt)} and completion {cut(completion)}"


def _checked(value: Any, name: str, example: Example, completion: str) -> float:
    what = None
    if (
        isinstance(value, (str, bytes))
        or value is None
        or not (isinstance(value, numbers.Real) or hasattr(value, "__float__"))
    ):
        what = f"returned {value!r} ({type(value).__name__}), not a number"
    else:
        number = float(value)
        if not math.isfinite(number):
            what = f"returned {number}, not a finite number"
        elif abs(number) > LARGEST:
            what = f"returned {number:g}, beyond what float32 can hold ({LARGEST:.3g})"
        else:
            return number
    raise RewardError(
        f"the reward {name} {what} for {_where(example, completion)}; rewards must be "
        "finite numbers (the advantages are computed from them)."
    )


def score_batch(
    reward: Callable[[str, str, str | None], Any],
    name: str,
    pairs: Sequence[tuple[Example, str]],
    timeout_s: float,
) -> list[float]:
    """Each ``(example, completion)`` scored by ``reward``, within ``timeout_s`` in all."""
    progress = {"index": 0}
    values: list[Any] = []
    failure: list[BaseException] = []

    def work() -> None:
        try:
            for index, (example, completion) in enumerate(pairs):
                progress["index"] = index
                values.append(
                    reward(prompt=example.prompt, completion=completion, answer=example.answer)
                )
        except BaseException as exc:
            failure.append(exc)

    worker = workers.start(work, "reward")
    worker.join(timeout_s)
    if worker.is_alive():
        example, completion = pairs[progress["index"]]
        raise RewardError(
            f"the reward {name} did not finish scoring a batch of {len(pairs)} completions "
            f"within {timeout_s:g}s (timeouts.reward_s); it was scoring "
            f"{_where(example, completion)}."
        )
    if failure:
        example, completion = pairs[progress["index"]]
        exc = failure[0]
        raise RewardError(
            f"the reward {name} raised {type(exc).__name__}: {exc} for "
            f"{_where(example, completion)}."
        ) from exc
    return [
        _checked(value, name, example, completion)
        for value, (example, completion) in zip(values, pairs, strict=True)
    ]
