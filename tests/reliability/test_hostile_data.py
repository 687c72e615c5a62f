"""Hostile data files: one huge line is refused with its file:line before anything is
parsed or tokenised, and every kind of bad line is named where it is."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import output_of, run_cli

pytestmark = pytest.mark.slow

BUDGETS = ["rl.max_prompt_length=32", "rl.max_completion_length=32"]


def test_a_50_mb_line_is_refused_with_its_file_and_line(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    with open(data, "w") as handle:
        handle.write('{"prompt": "ab=", "answer": "ba"}\n{"prompt": "')
        handle.write("x" * (50 << 20))
        handle.write('", "answer": "y"}\n')
    proc = run_cli("task=jsonl", f"task.path={data}", *BUDGETS, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1
    assert f"{data}:2: the line has 52,428,8" in out
    assert "rl.max_prompt_length=32" in out and "Traceback" not in out


def test_every_bad_line_of_a_file_is_named_in_one_report(tmp_path: Path) -> None:
    data = tmp_path / "data.jsonl"
    data.write_bytes(
        b'{"prompt": "ab=", "answer": "ba"}\n'
        b'{"prompt": "a\xff", "answer": "b"}\n'
        b'{"prompt": "cd=", "prompt": "dc="}\n'
        b'{"prompt": 7}\n'
        b"not json\n"
        b'{"prompt": "ef="}\n'
    )
    proc = run_cli("task=jsonl", f"task.path={data}", *BUDGETS, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1
    for line, words in [
        (2, "not valid UTF-8"),
        (3, "not valid JSON for a task: the key 'prompt' appears twice"),
        (4, "needs a non-empty string 'prompt'"),
        (5, "not valid JSON"),
        (6, "has no 'answer', which the reward art_hydra.tasks.rewards.exact_match needs"),
    ]:
        assert f"{data}:{line}: {words}" in out, out
