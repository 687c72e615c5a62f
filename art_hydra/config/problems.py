"""Problems found in a configuration, and the one report that lists them all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hydra.errors import CompactHydraException


@dataclass(frozen=True)
class Problem:
    """One reason a configuration cannot run.

    Every problem names the key path, the offending value, why it cannot work and the
    override that fixes it, so a user can act on each line without reading code.
    """

    #: Dotted key path (``trainer.learning_rate``), a group (``algorithm``) or an override.
    key: str
    #: The offending value, as the user wrote it or as it was composed.
    value: Any
    #: Why the value cannot work.
    reason: str
    #: A command-line override (or short instruction) that fixes it.
    fix: str

    def render(self, index: int) -> str:
        """Format as a numbered entry of the report."""
        shown = "" if self.value == self.key else f" = {_show(self.value)}"
        lines = [f"  {index}. {self.key}{shown}"]
        lines += [f"     {line}" for line in self.reason.strip().splitlines()]
        lines.append(f"     fix: {self.fix}")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value == "" or value.strip() != value else value
    if hasattr(value, "name") and hasattr(value, "value") and type(value).__module__ != "builtins":
        return str(value.name)  # Enum members print as their YAML spelling.
    return repr(value) if value is None else str(value)


#: Closing line of a report raised before anything of the run exists.
NOTHING_STARTED = "Nothing was started: no output directory, model or queue was created."


def format_report(
    problems: Sequence[Problem], header: str | None = None, footer: str | None = NOTHING_STARTED
) -> str:
    """All problems in one message, numbered, each with its fix."""
    n = len(problems)
    head = header or f"The configuration cannot run ({n} problem{'s' if n != 1 else ''}):"
    lines = [head, *(p.render(i) for i, p in enumerate(problems, 1))]
    if footer:
        lines.append(footer)
    return "\n".join(lines)


class ConfigValidationError(CompactHydraException):
    """Raised when a configuration cannot run; its message is the full report.

    Subclassing Hydra's ``CompactHydraException`` makes Hydra print the message alone,
    without a traceback, unless ``HYDRA_FULL_ERROR=1`` is set.
    """

    def __init__(
        self,
        problems: Sequence[Problem],
        header: str | None = None,
        footer: str | None = NOTHING_STARTED,
    ) -> None:
        self.problems: list[Problem] = list(problems)
        super().__init__(format_report(self.problems, header, footer))
