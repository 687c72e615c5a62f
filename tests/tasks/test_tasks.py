"""Tasks: reproducible toy data, rewards, and JSONL errors that name the file and line."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from art_hydra.tasks.base import TaskDataError
from art_hydra.tasks.jsonl import read_jsonl
from art_hydra.tasks.rewards import char_overlap, exact_match
from art_hydra.tasks.toy import digit_sum_examples, reverse_examples


def test_toy_tasks_are_reproducible_and_depend_on_the_prompt() -> None:
    a = list(reverse_examples(random.Random(3), 50, length=3, alphabet="abcd"))
    assert a == list(reverse_examples(random.Random(3), 50, length=3, alphabet="abcd"))
    assert all(ex.answer == ex.prompt[:-1][::-1] for ex in a)
    assert len({ex.answer for ex in a}) > 10  # not a fixed target
    sums = list(digit_sum_examples(random.Random(0), 20))
    assert all(int(ex.answer) == int(ex.prompt[0]) + int(ex.prompt[2]) for ex in sums)


def test_rewards() -> None:
    assert exact_match("", " cba ", "cba") == 1.0 and exact_match("", "cb", "cba") == 0.0
    assert char_overlap("", "cba", "cba") == 1.0
    assert char_overlap("", "cxa", "cba") == pytest.approx(2 / 3)
    assert char_overlap("", "cbaaaa", "cba") == pytest.approx(3 / 6)


@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        ('{"prompt": "a", "answer": "b"}\n{"prompt": "c"\n', 2, "not valid JSON"),
        ('{"prompt": "a"}\n\n[1, 2]\n', 3, "expected a JSON object"),
        ('{"question": "a"}\n', 1, "needs a non-empty string 'prompt'"),
        ('{"prompt": "a", "answer": 4}\n', 1, "'answer' must be a string"),
    ],
)
def test_bad_jsonl_names_file_and_line(tmp_path: Path, content: str, line: int, words: str) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text(content)
    with pytest.raises(TaskDataError) as info:
        read_jsonl(str(path))
    assert f"{path}:{line}:" in str(info.value) and words in str(info.value)


def test_good_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_text('{"prompt": "2+2=", "answer": "4"}\n\n{"prompt": "hi"}\n')
    examples = read_jsonl(str(path))
    assert [(e.prompt, e.answer) for e in examples] == [("2+2=", "4"), ("hi", None)]
