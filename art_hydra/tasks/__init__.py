"""Tasks: where training examples come from and how completions are scored.

Pure Python (no torch): a task is a list of examples plus a reward function, both
chosen by the ``task`` config section and resolved through the target allowlist.
"""

from art_hydra.tasks.base import Task, build_task
from art_hydra.tasks.examples import Example, TaskDataError

__all__ = ["Example", "Task", "TaskDataError", "build_task"]
