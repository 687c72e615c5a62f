"""What a task is made of: examples, and the error raised for data that cannot be used."""

from __future__ import annotations

from dataclasses import dataclass

from hydra.errors import CompactHydraException


@dataclass(frozen=True)
class Example:
    """One training example: a prompt and, optionally, its reference answer."""

    prompt: str
    answer: str | None = None


class TaskDataError(CompactHydraException, ValueError):
    """Task data or task code that cannot be used; the message names the file and line.

    A user's mistake, not a bug: Hydra prints the message alone, without a traceback.
    """
