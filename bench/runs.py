"""What the bench scripts that run whole trainings share: the overrides that keep a
measured run to its own work, and the learning target they report."""

from __future__ import annotations

#: No progress bar, TensorBoard, plot or checkpoints: only the training itself is timed.
QUIET = [
    "logging.progress_bar=off",
    "logging.tensorboard=false",
    "logging.plot=false",
    "checkpoint.every_steps=0",
]
#: Reward target: the mean over this many consecutive steps.
TARGET, WINDOW = 0.9, 5


def step_reaching_target(rewards: list[float]) -> int | None:
    """The first step at which the mean reward over the last ``WINDOW`` steps reaches
    ``TARGET`` (steps count from 1); None when no step does."""
    return next(
        (
            i + WINDOW
            for i in range(len(rewards) - WINDOW + 1)
            if sum(rewards[i : i + WINDOW]) / WINDOW >= TARGET
        ),
        None,
    )
