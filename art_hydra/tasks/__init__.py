"""Tasks: where training examples come from and how completions are scored.

Pure Python (no torch): a task is a list of examples plus a reward function, both
chosen by the ``task`` config section.
"""

from art_hydra.tasks.base import Example, Task, TaskDataError, build_task

__all__ = ["Example", "Task", "TaskDataError", "build_task"]
