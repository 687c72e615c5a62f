"""Group-normalised advantages (GRPO)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def group_advantages(
    rewards: Sequence[float], group_size: int, scale: bool, eps: float = 1e-4
) -> tuple[list[float], list[bool]]:
    """Advantages of completions grouped by prompt, and which groups carry no signal
    (their count is the ``zero_std_groups`` metric).

    Within each consecutive group of ``group_size`` rewards the advantage is the reward
    minus the group mean, divided by the group's sample standard deviation (plus
    ``eps``) when ``scale``. A group whose rewards are all equal has advantage 0 for
    every member: it contributes nothing to the gradient and is flagged.
    """
    if group_size < 2 or len(rewards) % group_size:
        raise ValueError(f"{len(rewards)} rewards do not split into groups of {group_size}")
    advantages: list[float] = []
    zero_spread: list[bool] = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / group_size
        zero_spread.append(max(group) == min(group))
        if zero_spread[-1]:
            advantages.extend([0.0] * group_size)
            continue
        centred = [r - mean for r in group]
        if scale:
            std = math.sqrt(sum(c * c for c in centred) / (group_size - 1))
            centred = [c / (std + eps) for c in centred]
        advantages.extend(centred)
    return advantages, zero_spread
