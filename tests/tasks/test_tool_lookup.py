"""The tool-use demo (experiment=tool_use): a task whose reward needs the tool, and, run
for real as the README runs it, a tiny model that learns to call it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from conftest import run_cli

from art_hydra.tasks.tool_lookup import LookupEnv, lookup, lookup_examples, value_of


@pytest.mark.fast
def test_only_the_tool_knows_the_answer() -> None:
    examples = list(lookup_examples(random.Random(0), 200, tool_share=0.25))
    assert all(ex.answer == value_of(ex.prompt) and ex.answer not in ex.prompt for ex in examples)
    env = LookupEnv()
    env.reset(prompt="ab")
    assert env.lookup("ab") == lookup(" ab ") == value_of("ab") and env.calls == 1
    calling = [ex for ex in examples if len(ex.conversation_messages()) == 4]
    assert 30 <= len(calling) <= 70  # about a quarter demonstrate the tool, the rest guess
    call = calling[0].conversation_messages()[1]["tool_calls"][0]["function"]
    assert call == {"name": "lookup", "arguments": {"key": calling[0].prompt}}


@pytest.mark.slow
def test_the_demo_learns_to_call_the_tool(tmp_path: Path) -> None:
    """The demo, shortened to 30 RL steps: the warm-started model calls the tool now and
    then and scores at most 0.3; RL makes the call (nearly) always, the reward past 0.8."""
    run = tmp_path / "run"
    proc = run_cli(
        "experiment=tool_use",
        "trainer.max_steps=30",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        f"hydra.run.dir={run}",
        cwd=tmp_path,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "tool calls" in proc.stdout  # the progress line shows them
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "tool_calls_mean" in r]
    assert rows[0]["reward_mean"] <= 0.3 and rows[0]["tool_calls_mean"] <= 0.5, rows[0]
    last = rows[-10:]
    assert sum(r["reward_mean"] for r in last) / len(last) >= 0.8, last
    assert sum(r["tool_calls_mean"] for r in last) / len(last) >= 0.9, last
    assert all(0 < r["masked_token_share"] < 0.5 for r in last)
    assert all(r["sampling_mismatch_max"] < 1e-4 for r in rows)  # trained = sampled tokens
    line = json.loads((run / "completions.jsonl").read_text().splitlines()[-1])
    messages = line["samples"][0]["completions"][0]["messages"]
    assert [m["role"] for m in messages][:3] == ["user", "assistant", "tool"]
    (call,) = messages[1]["tool_calls"]
    assert call["type"] == "function" and call["function"]["name"] == "lookup"
    assert json.loads(call["function"]["arguments"]) == {"key": messages[0]["content"]}
