"""The ``eval`` section: composed and checked through the real CLI (errors with the
override that fixes them, warnings that let the run go), and the held-out split
(by distinct prompt, by seed, disjoint from the training data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, report_entries

from art_hydra import compose
from art_hydra.tasks import Example, TaskDataError
from art_hydra.tasks.held_out import eval_examples, split_examples

pytestmark = pytest.mark.fast


def _keys(proc) -> dict[str, tuple[str, str]]:  # type: ignore[no-untyped-def]
    return {key: (value, fix) for key, value, fix in report_entries(output_of(proc))}


def test_evaluation_is_off_by_default_and_its_section_composes(cli) -> None:
    cfg = compose([])
    assert cfg.eval.fraction == 0 and cfg.eval.path is None and cfg.eval.split is None
    proc = cli("eval.fraction=0.125", "eval.every_steps=50", "eval.num_samples=2", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "fraction: 0.125" in proc.stdout


def test_impossible_eval_settings_are_errors_with_their_fix(cli) -> None:
    proc = cli("eval.fraction=1.0", "eval.split=test", "objective.metric=eval/nope")
    assert proc.returncode == 1, output_of(proc)
    found = _keys(proc)
    assert found["eval.fraction"][1].startswith("eval.fraction=0.0")  # [0, 1): the default
    assert "eval.split=null" in found["eval.split"][1]  # generated task: no splits
    assert "Nothing was started" in output_of(proc)


def test_a_task_too_small_to_hold_out_a_prompt_is_refused(cli, tmp_path: Path) -> None:
    proc = cli("eval.fraction=0.01", "task.num_examples=20")
    assert proc.returncode == 1, output_of(proc)
    assert _keys(proc)["eval.fraction"][1] == "eval.fraction=0.05"
    # A file's distinct prompts are counted by the pre-flight, before any model loads.
    data = tmp_path / "three.jsonl"
    rows = [{"prompt": p, "answer": p[::-1]} for p in ("ab=", "ba=", "ab=", "cc=")]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    proc = cli("task=jsonl", f"task.path={data}", "eval.fraction=0.1")
    assert proc.returncode == 1, output_of(proc)
    value, fix = _keys(proc)["eval.fraction"]
    assert value == "0.1" and fix.startswith("eval.fraction=0.3333")


def test_both_a_fraction_and_a_file_or_an_unreadable_file_are_refused(cli, tmp_path: Path) -> None:
    data = tmp_path / "eval.jsonl"
    data.write_text('{"prompt": "ab=", "answer": "ba"}\n')
    proc = cli(f"eval.path={data}", "eval.fraction=0.1")
    assert proc.returncode == 1, output_of(proc)
    assert "eval.fraction=0" in _keys(proc)["eval.path"][1]
    proc = cli(f"eval.path={tmp_path / 'missing.jsonl'}")
    assert proc.returncode == 1, output_of(proc)
    assert "eval.path" in _keys(proc)
    proc = cli(f"eval.path={data}", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)


def test_the_objective_may_name_an_eval_metric_only_with_evaluation_on(cli) -> None:
    proc = cli("objective.metric=eval/reward")
    assert proc.returncode == 1, output_of(proc)
    value, fix = _keys(proc)["objective.metric"]
    assert value == "eval/reward" and fix.startswith("eval.fraction=0.1")
    proc = cli("objective.metric=eval/exact", "eval.fraction=0.125", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    cfg = compose(["algorithm=sft", "objective.metric=eval/loss", "eval.fraction=0.125"])
    from art_hydra.config.objective import resolve

    assert resolve(cfg.objective, cfg.algorithm.name).direction == "minimize"


def test_eval_settings_without_evaluation_are_a_warning(cli) -> None:
    proc = cli("eval.every_steps=10", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "eval.every_steps" in output_of(proc) and "evaluation is off" in output_of(proc)


def _examples() -> list[Example]:
    prompts = [f"{a}{b}=" for a in "abcd" for b in "abcd"]  # 16 distinct
    return [Example(p, p[::-1]) for p in prompts for _ in range(3)] + [Example("ab=", "ba")]


def test_the_held_out_split_is_by_distinct_prompt_seeded_and_disjoint() -> None:
    examples = _examples()
    train, held = split_examples(examples, 0.25, seed=7)
    assert len(held) == 4 and len({e.prompt for e in held}) == 4
    held_prompts = {e.prompt for e in held}
    assert not held_prompts & {e.prompt for e in train}  # never trained on
    # Every copy of a prompt is on one side: nothing is lost.
    assert len(train) + sum(e.prompt in held_prompts for e in examples) == len(examples)
    assert [e.prompt for e in train] == [e.prompt for e in examples if e.prompt not in held_prompts]
    again = split_examples(examples, 0.25, seed=7)
    assert again == (train, held)
    other = {e.prompt for e in split_examples(examples, 0.25, seed=8)[1]}
    assert other != held_prompts  # another seed holds out other prompts
    with pytest.raises(TaskDataError, match=r"eval.fraction=0.0625"):
        split_examples(examples, 0.01, seed=7)


def test_eval_path_reads_its_own_data_and_leaves_the_training_data(tmp_path: Path) -> None:
    data = tmp_path / "eval.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": p, "answer": p[:2][::-1]}) + "\n" for p in ("ab=", "ab=", "cd=")
        )
    )
    cfg = compose([f"eval.path={data}", "eval.max_examples=5"])
    examples = _examples()
    train, held = eval_examples(cfg, examples)
    assert train == examples
    assert [e.prompt for e in held] == ["ab=", "cd="]  # one per distinct prompt
    assert eval_examples(compose([]), examples) == (examples, [])
