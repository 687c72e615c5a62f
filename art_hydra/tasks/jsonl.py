"""Read a user's JSONL file: one {"prompt": str, "answer": str (optional)} per line."""

from __future__ import annotations

import json
import os

from art_hydra.tasks.base import Example, TaskDataError


def read_jsonl(path: str) -> list[Example]:
    """Every example in ``path``; bad data raises an error naming the file and line."""
    path = os.path.expanduser(path)
    examples: list[Example] = []
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 (closed below)
    except OSError as exc:
        raise TaskDataError(f"{path}: cannot open task data: {exc.strerror}") from exc
    with handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise TaskDataError(f"{where}: not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise TaskDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
            prompt = record.get("prompt")
            if not isinstance(prompt, str) or not prompt:
                raise TaskDataError(f"{where}: needs a non-empty string 'prompt'")
            answer = record.get("answer")
            if answer is not None and not isinstance(answer, str):
                raise TaskDataError(f"{where}: 'answer' must be a string when present")
            examples.append(Example(prompt=prompt, answer=answer))
    if not examples:
        raise TaskDataError(f"{path}: no examples (the file is empty)")
    return examples
