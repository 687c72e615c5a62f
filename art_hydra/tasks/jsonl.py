"""Read a user's JSONL file: one {"prompt": str, "answer": str (optional)} object per line
(other keys are kept for the rewards).

The file is streamed, never loaded whole: memory grows with the examples kept, not with
the file. Each line is checked for size before it is decoded or parsed, so one huge
line is refused at once (``file:line``) instead of being parsed and tokenised. Every
problem names its ``file:line``: bytes that are not UTF-8, a ``\\ud800`` escape (a lone
surrogate, which no tokenizer can encode), nesting deeper than
:data:`~art_hydra.safe_json.MAX_DEPTH` (measured before parsing, which would otherwise
recurse until ``RecursionError``), JSON that does not parse, duplicate keys (the JSON
standard leaves them undefined and Python silently keeps the last), wrong types, and a
missing answer where the reward or SFT needs one. Only a regular file is read (a FIFO
or ``/dev/zero`` would never end); its total size is not bounded, as it is streamed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from art_hydra import safe_json
from art_hydra.safe_paths import open_regular
from art_hydra.tasks.examples import Example, TaskDataError

#: A line may take this many bytes per token of its length budget: far more than any
#: tokenizer packs into one token, so only a line that cannot fit is refused.
BYTES_PER_TOKEN = 64
#: Room beyond the token budget for JSON syntax, an answer and other fields.
LINE_SLACK_BYTES = 64 * 1024
#: Problems listed in a report; the rest are counted.
MAX_LISTED = 10


def line_limit(budget_tokens: int) -> int:
    """The most bytes a line may take when its text must fit ``budget_tokens`` tokens."""
    return BYTES_PER_TOKEN * budget_tokens + LINE_SLACK_BYTES


@dataclass
class Scan:
    """What one pass over a file found."""

    examples: int = 0
    #: ``path:line: message`` for the first :data:`MAX_LISTED` problems.
    errors: list[str] = field(default_factory=list)
    #: Every problem, listed or not.
    error_count: int = 0
    #: Overrides that would repair the first problem that has one (a column mapping).
    fix: dict[str, str] | None = None
    #: What to do, in words, where no override repairs it (a hub dataset to download).
    note: str | None = None
    #: Settings the data's format does not read, by key: ``(value, why, the overrides
    #: that make the data read as meant)`` (a warning).
    unused: dict[str, tuple[Any, str, dict[str, Any]]] = field(default_factory=dict)

    def add_error(self, where: str, message: str, fix: dict[str, str] | None = None) -> None:
        self.error_count += 1
        if len(self.errors) < MAX_LISTED:
            self.errors.append(f"{where}: {message}")
        if fix is not None and self.fix is None:
            self.fix = fix

    def summary(self) -> str:
        more = self.error_count - len(self.errors)
        return "\n".join(self.errors) + (f"\n... and {more} more" if more > 0 else "")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise ValueError(f"the key '{key}' appears twice")
        record[key] = value
    return record


def _decode(raw: bytes) -> dict[str, Any] | str:
    """The line's JSON object, or why it is not one."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not valid UTF-8 (byte 0x{raw[exc.start]:02x} at offset {exc.start})"
    try:
        record = safe_json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        return f"not valid JSON ({exc.msg} at column {exc.colno})"
    except safe_json.JsonRefused as exc:  # too deep to parse, or a string that is not text
        return str(exc)
    except ValueError as exc:
        return f"not valid JSON for a task: {exc}"
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    return record


def trl_format(record: dict[str, Any]) -> str | None:
    """The TRL dataset format a line is in where ``task=jsonl`` cannot read it as meant
    (its ``prompt`` and ``answer``), or None: a conversation (``messages``, or a
    ``prompt`` that is a list of messages), or prompt-completion (``completion`` and no
    ``answer``: the completion would be a mere column, not the answer). ``task=dataset``
    reads them all."""
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        return "conversational format (a 'prompt' that is a list of messages)"
    if prompt is None and isinstance(record.get("messages"), list):
        return "conversational language-modeling format ('messages')"
    if isinstance(prompt, str) and "completion" in record and "answer" not in record:
        return "prompt-completion format ('prompt' and 'completion')"
    return None


def record_example(record: dict[str, Any], answer_needed_by: str | None) -> Example | str:
    """``task=jsonl``'s line: a ``prompt`` and an optional ``answer``; every other key is
    kept in :attr:`Example.columns` for the rewards."""
    prompt = record.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        return "needs a non-empty string 'prompt'"
    answer = record.get("answer")
    if answer is not None and not isinstance(answer, str):
        return f"'answer' must be a string, not {type(answer).__name__}"
    if answer_needed_by and not answer:
        return f"has no 'answer', which {answer_needed_by} needs"
    columns = {k: v for k, v in record.items() if k != "prompt"}
    return Example(prompt=prompt, answer=answer, columns=columns)


def iter_records(
    path: str, *, max_line_bytes: int, limit_reason: str = ""
) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Stream ``path``'s lines as ``(file:line, JSON object or why the line is not one)``;
    blank lines are skipped, an unreadable file is one error named by its path."""
    try:
        handle = open_regular(path)
    except OSError as exc:
        yield path, f"cannot be read as task data: {exc.strerror}"
        return
    try:
        with handle:
            number = 0
            while raw := handle.readline(max_line_bytes + 1):
                number += 1
                where = f"{path}:{number}"
                if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                    raw = raw[3:]  # a UTF-8 byte order mark (Windows exports write one)
                if len(raw) > max_line_bytes and not raw.endswith(b"\n"):
                    size = len(raw)
                    while chunk := handle.readline(1 << 20):  # skip the rest, holding none of it
                        size += len(chunk)
                        if chunk.endswith(b"\n"):
                            break
                    yield (
                        where,
                        f"the line has {size:,} bytes, far more than a prompt that fits "
                        f"{limit_reason} could take (at most {max_line_bytes:,} bytes per line)",
                    )
                    continue
                if raw.strip():
                    yield where, _decode(raw)
    except OSError as exc:  # a failing disk, a file truncated under the scan
        yield path, f"reading the task data failed: {exc.strerror or exc}"


def scan_jsonl(
    path: str,
    *,
    max_line_bytes: int,
    limit_reason: str = "",
    answer_needed_by: str | None = None,
    visit: Callable[[int, Example], None] | None = None,
) -> Scan:
    """Stream ``path``: count its examples, hand each to ``visit`` with its line number,
    and collect every problem with its ``file:line``."""
    scan = Scan()
    path = os.path.expanduser(path)
    for where, record in iter_records(
        path, max_line_bytes=max_line_bytes, limit_reason=limit_reason
    ):
        parsed = record if isinstance(record, str) else record_example(record, answer_needed_by)
        if isinstance(parsed, str):
            scan.add_error(where, parsed)
            continue
        scan.examples += 1
        if visit is not None:
            visit(int(where.rpartition(":")[2]), parsed)
    if scan.examples == 0 and scan.error_count == 0:
        scan.add_error(path, "no examples (the file is empty)")
    return scan


def read_jsonl(
    path: str,
    *,
    max_line_bytes: int = line_limit(1 << 20),
    limit_reason: str = "the length budget",
    answer_needed_by: str | None = None,
) -> list[Example]:
    """Every example in ``path``; bad data raises one error listing each ``file:line``."""
    examples: list[Example] = []
    scan = scan_jsonl(
        path,
        max_line_bytes=max_line_bytes,
        limit_reason=limit_reason,
        answer_needed_by=answer_needed_by,
        visit=lambda _, example: examples.append(example),
    )
    if scan.error_count:
        raise TaskDataError(f"the task data cannot be used:\n{scan.summary()}")
    return examples
