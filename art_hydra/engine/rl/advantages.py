"""Advantages of grouped completions (GRPO), by a registered estimator.

:func:`group_advantages` splits a generation batch into its groups (one prompt's
completions each) and asks the estimator ``rl.advantage_estimator`` names for each
group's advantages; the built-in ``group_relative`` (GRPO's group-normalised reward)
registers here with :func:`register_advantage_estimator`, as a plugin's would. The
registry (:mod:`art_hydra.config.advantage_estimators`) holds the names validation
reads; this module imports nothing heavy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from art_hydra.config.advantage_estimators import (
    get_advantage_estimator,
    register_advantage_estimator,
)

__all__ = ["group_advantages", "group_relative", "register_advantage_estimator"]


@register_advantage_estimator(
    "group_relative", help="GRPO: the reward minus its group's mean, over the group's std"
)
def group_relative(group: Sequence[float], scale: bool, eps: float) -> list[float]:
    """GRPO's advantage: the reward minus the group mean, divided by the group's sample
    standard deviation (plus ``eps``) when ``scale``. A group whose rewards are all equal
    has advantage 0 for every member (exactly, whatever the mean's rounding)."""
    if max(group) == min(group):
        return [0.0] * len(group)
    centred = _centred(group)
    if scale:
        std = _sample_std(centred)
        centred = [c / (std + eps) for c in centred]
    return centred


def _centred(group: Sequence[float]) -> list[float]:
    mean = sum(group) / len(group)
    return [r - mean for r in group]


def _sample_std(centred: Sequence[float]) -> float:
    """The sample standard deviation of rewards already centred on their mean."""
    return math.sqrt(sum(c * c for c in centred) / (len(centred) - 1))


#: A group whose rewards' standard deviation is at most this carries no signal. TRL's
#: rule (``torch.isclose(std, 0)``, whose absolute tolerance is 1e-8): rewards that
#: differ only by rounding (0.1 + 0.2 against 0.3) count as equal, as they do there.
ZERO_STD_TOLERANCE = 1e-8


def no_spread(group: Sequence[float]) -> bool:
    """Whether ``group``'s rewards are equal within :data:`ZERO_STD_TOLERANCE` (their
    sample standard deviation, as TRL computes it with ``torch.std``)."""
    return _sample_std(_centred(group)) <= ZERO_STD_TOLERANCE


def group_advantages(
    rewards: Sequence[float],
    group_size: int,
    scale: bool,
    eps: float = 1e-4,
    estimator: str = "group_relative",
) -> tuple[list[float], list[bool]]:
    """Advantages of completions grouped by prompt, and which groups carry no signal
    (their rewards are equal within :data:`ZERO_STD_TOLERANCE`; their count is the
    ``zero_std_groups`` metric).

    Each consecutive group of ``group_size`` rewards goes to the registered estimator
    ``estimator`` (``rl.advantage_estimator``) with ``scale`` (``rl.scale_rewards``) and
    ``eps``, which returns one advantage per reward.
    """
    if group_size < 2 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    found = get_advantage_estimator(estimator)
    if found is None:
        raise ValueError(f"rl.advantage_estimator={estimator} is not a registered estimator")
    advantages: list[float] = []
    zero_spread: list[bool] = []
    for start in range(0, len(rewards), group_size):
        group = list(rewards[start : start + group_size])
        zero_spread.append(no_spread(group))
        values = [float(a) for a in found.fn(group, scale, eps)]
        if len(values) != group_size:
            raise ValueError(
                f"advantage estimator {estimator!r} returned {len(values)} advantages for a "
                f"group of {group_size} rewards"
            )
        advantages.extend(values)
    return advantages, zero_spread
