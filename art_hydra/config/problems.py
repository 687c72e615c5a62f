"""Problems found in a configuration, and the one report that lists them all.

A :class:`Problem` is data, not prose: it carries its :class:`Kind` (what sort of check
found it), its :class:`Severity` (the run cannot work, or it works but is probably not
what was meant) and a structured :class:`Fix` (the overrides that repair it). Code that
sorts, deduplicates or applies problems reads those fields, never the message text.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from hydra.errors import CompactHydraException


class Severity(Enum):
    """Whether a problem stops the run."""

    #: The run cannot work; nothing starts.
    error = "error"
    #: The run works but is probably not what was meant; printed, and the run goes on
    #: (``strict=true`` makes warnings fatal).
    warning = "warning"


class Kind(Enum):
    """Which check found a problem (the three moments: composition, world, run)."""

    override = "override"  # an override that does not parse, or a sweep in a single run
    group = "group"  # a config group option that does not exist
    type = "type"  # a value of the wrong type
    unknown_key = "unknown_key"  # a key the schema does not have
    missing = "missing"  # a mandatory ??? value
    deleted = "deleted"  # a schema field removed with ~key
    interpolation = "interpolation"  # an interpolation that does not resolve
    bound = "bound"  # a single-field bound declared on the schema
    rule = "rule"  # a cross-field rule (a registered validator)
    world = "world"  # files, installed packages, devices, the run folder
    run = "run"  # what only the loaded model can tell
    plugin = "plugin"  # a validator plugin that failed to import or crashed


class Placeholder(str):
    """A value only the user can supply (the path of their model folder, a value of their
    choice), marked as such: a fix holding one is not applied literally, and its report
    says to replace the ``<...>``. Its text says what belongs there."""

    def __repr__(self) -> str:
        return f"<{self!s}>"


def placeholder(what: str) -> Placeholder:
    """A :class:`Placeholder` describing what the user puts there (``"value"``)."""
    return Placeholder(what)


def override_value(value: Any) -> str:
    """A value as a Hydra command-line override spells it (a placeholder as ``<...>``)."""
    if isinstance(value, Placeholder):
        return f"<{value}>"
    if isinstance(value, bool):
        return str(value).lower()
    if value is None:
        return "null"
    if isinstance(value, Enum):
        return str(value.name)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{override_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, float) and value == int(value) and abs(value) < 1e15:
        return repr(value)
    return str(value)


@dataclass(frozen=True)
class Fix:
    """What repairs a problem: overrides to set, a note, and optionally another way."""

    #: ``(key, value)`` pairs: the overrides that fix it, applied together.
    sets: tuple[tuple[str, Any], ...] = ()
    #: An instruction or an explanation shown after the overrides.
    note: str = ""
    #: Another fix that works as well.
    alt: Fix | None = None
    #: Keys whose own overrides this fix replaces (a misspelt key, a ``+key`` that cannot
    #: apply): the user's override of each is dropped, not kept beside it. A key that
    #: ``sets`` does not set again (nor a key above it) is deleted, rendered as Hydra's
    #: ``~key``, so the fix can be pasted after the command line. A drop written ``~key``
    #: names an override of key that nothing appended can undo (the deletion ``~trainer``,
    #: a section set to a value): only leaving it out does, so it renders as nothing (the
    #: note says so).
    drops: tuple[str, ...] = ()

    def overrides(self) -> list[str]:
        """The fix's values as command-line overrides (empty when it is an instruction)."""
        return [f"{key}={override_value(value)}" for key, value in self.sets]

    def deletions(self) -> list[str]:
        """The keys the fix drops without setting them again, as Hydra's ``~key``."""
        replaced = [key.lstrip("+~") for key, _ in self.sets]
        return [
            f"~{key}"
            for key in self.drops
            if key[:1] != "~" and not any(key == r or key.startswith(f"{r}.") for r in replaced)
        ]

    @property
    def has_placeholder(self) -> bool:
        """Whether a value must be replaced by the user's own (never applied literally)."""
        return any(isinstance(value, Placeholder) for _, value in self.sets)

    def render(self) -> str:
        text = " ".join([*self.overrides(), *self.deletions()])
        note = self.note
        if self.has_placeholder:
            note = f"{note}; replace <...>" if note else "replace <...>"
        if note:
            text = f"{text} ({note})" if text else note
        return f"{text}, or {self.alt.render()}" if self.alt is not None else text


def fix(
    sets: Mapping[str, Any] | None = None,
    note: str = "",
    alt: Fix | None = None,
    drops: tuple[str, ...] = (),
) -> Fix:
    """Build a :class:`Fix` from a mapping of key -> value."""
    return Fix(tuple((sets or {}).items()), note, alt, drops)


@dataclass(frozen=True)
class Problem:
    """One reason a configuration cannot run (or a warning that it may not do what was meant).

    It names the key path, the offending value, why, and what fixes it, so a user can
    act on each entry without reading code.
    """

    #: Dotted key path (``trainer.learning_rate``), a group (``algorithm``) or an override.
    key: str
    #: The offending value, as written or as composed.
    value: Any
    #: Why the value cannot work (or looks like a mistake).
    reason: str
    #: What fixes it: a :class:`Fix`, or a plain instruction from a third-party validator.
    fix: Fix | str
    #: Which check found it.
    kind: Kind = Kind.rule
    #: Error (nothing runs) or warning (the run goes on).
    severity: Severity = Severity.error

    @property
    def is_error(self) -> bool:
        return self.severity == Severity.error

    def render(self, index: int) -> str:
        """Format as a numbered entry of the report."""
        shown = "" if self.value == self.key else f" = {_show(self.value)}"
        lines = [f"  {index}. {self.key}{shown}"]
        lines += [f"     {line}" for line in self.reason.strip().splitlines()]
        text = self.fix if isinstance(self.fix, str) else self.fix.render()
        lines.append(f"     fix: {text}")
        return "\n".join(lines)


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value) if value == "" or value.strip() != value else value
    if isinstance(value, Enum):
        return str(value.name)  # Enum members print as their YAML spelling.
    return repr(value) if value is None else str(value)


def errors(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if p.is_error]


def warnings_of(problems: Iterable[Problem]) -> list[Problem]:
    return [p for p in problems if not p.is_error]


#: Closing line of a report raised before anything of the run exists.
NOTHING_STARTED = "Nothing was started: no output directory, model or queue was created."


def _count(n: int, word: str) -> str:
    return f"{n} {word}{'s' if n != 1 else ''}"


def _revealed_lines(revealed: Sequence[tuple[int, Problem]], first: int) -> list[str]:
    """The errors the fixes reveal, under a line per round saying which fixes reveal them."""
    lines: list[str] = []
    index = first
    for round_number in sorted({r for r, _ in revealed}):
        found = [p for r, p in revealed if r == round_number]
        appear = f"{_count(len(found), 'more problem')} appear{'s' if len(found) == 1 else ''}"
        lines.append(
            f"Once the fixes above are applied, {appear}:"
            if round_number == 1
            else f"Once those fixes are applied too, {appear}:"
        )
        lines += [p.render(i) for i, p in enumerate(found, index)]
        index += len(found)
    return lines


def format_report(
    problems: Sequence[Problem],
    header: str | None = None,
    footer: str | None = NOTHING_STARTED,
    revealed: Sequence[tuple[int, Problem]] = (),
) -> str:
    """Every problem in one message, errors first, each numbered with its fix (a warning
    on a key that also has an error is left out: the error says more). ``revealed``:
    the errors that appear once the fixes are applied, with the round that shows each
    (:mod:`art_hydra.config.fix_chain`), listed after the errors."""
    errs = errors(problems)
    failed = {p.key for p in errs}
    warns = [p for p in warnings_of(problems) if p.key not in failed]
    lines: list[str] = []
    if errs:
        lines.append(header or f"The configuration cannot run ({_count(len(errs), 'problem')}):")
        lines += [p.render(i) for i, p in enumerate(errs, 1)]
        lines += _revealed_lines(revealed, len(errs) + 1)
    if warns:
        if errs:
            lines.append(f"Also {_count(len(warns), 'warning')} (the run would work, but check):")
        else:
            lines.append(
                header
                or f"The configuration runs, with {_count(len(warns), 'warning')} "
                "(strict=true makes warnings fatal):"
            )
        lines += [p.render(i) for i, p in enumerate(warns, len(errs) + len(revealed) + 1)]
    if errs and footer:
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
        revealed: Sequence[tuple[int, Problem]] = (),
    ) -> None:
        self.problems: list[Problem] = list(problems)
        #: The errors the report's fixes reveal, with their round (not in ``problems``:
        #: the config as given does not have them).
        self.revealed: list[tuple[int, Problem]] = list(revealed)
        super().__init__(format_report(self.problems, header, footer, self.revealed))
