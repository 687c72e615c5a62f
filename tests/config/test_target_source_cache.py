"""A target's source is parsed once per version of its file: a sweep asks about the same
reward at every point, and an edited file is read again
(:func:`art_hydra.config.targets.marker_in_source`)."""

from __future__ import annotations

import ast
import importlib
import os
from typing import Any

import pytest

from art_hydra.config import targets


def test_a_source_is_parsed_once_until_it_changes(tmp_path, monkeypatch) -> None:
    source = tmp_path / "cached_rewards_mod.py"
    source.write_text("@reward\ndef score(x):\n    return 1\n\ndef plain(x):\n    return 0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    parsed: list[str] = []
    real_parse = ast.parse

    def counted_parse(*args: Any, **kwargs: Any) -> Any:  # ast.parse is shared: pass through
        if str(kwargs.get("filename", "")).endswith("cached_rewards_mod.py"):
            parsed.append(kwargs["filename"])
        return real_parse(*args, **kwargs)

    monkeypatch.setattr(ast, "parse", counted_parse)
    assert targets.marker_in_source("cached_rewards_mod.score", "reward") is True
    assert targets.marker_in_source("cached_rewards_mod.plain", "reward") is False
    assert targets.marker_in_source("cached_rewards_mod.absent", "reward") is None
    assert len(parsed) == 1
    stat = source.stat()
    source.write_text("def score(x):\n    return 1\n")
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert targets.marker_in_source("cached_rewards_mod.score", "reward") is False
    assert len(parsed) == 2


@pytest.mark.parametrize("text", ["def score(:\n", "\udcff"])
def test_a_source_that_cannot_be_parsed_is_unknown(tmp_path, monkeypatch, text: str) -> None:
    source = tmp_path / "broken_rewards_mod.py"
    source.write_bytes(text.encode("utf-8", "surrogateescape"))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    assert targets.marker_in_source("broken_rewards_mod.score", "reward") is None
