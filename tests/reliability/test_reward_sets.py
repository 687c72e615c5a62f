"""Several rewards, per sample or batched as TRL calls them (issue 18, item 2).

``task.rewards`` lists ``{_target_, weight, name}``; each reward is a per-sample function
or a TRL-style batched one (``f(prompts, completions, **columns) -> list[float | None]``).
The total is the weighted sum of those that apply; each is logged as ``reward/<name>``.
The world pre-flight resolves each through the trust rules and calls it on real rows; a
config file cannot get an unmarked function run through the list (each attack carries a
payload that would create a marker file, and the test asserts it does not exist).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, run_cli

from art_hydra import ConfigValidationError, compose
from art_hydra.errors import RewardError
from art_hydra.preflight import world_problems
from art_hydra.tasks.examples import Example
from art_hydra.tasks.reward_set import RewardSpec, calling
from art_hydra.tasks.scoring import BoundReward, score_rewards

MODULE = """
import math
from art_hydra import reward
from art_hydra.tasks import Example

def acc(completions, solution, **kwargs):
    '''TRL-style: a 'solution' column, completions as text or as messages.'''
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if t.strip() == s else 0.0 for t, s in zip(texts, solution)]

def length(prompt, completion):
    return float(len(completion)) / 8

def odd_only(prompts, completions):
    return [1.0 if len(c) % 2 else None for c in completions]

def examples(rng, num_examples, length=3, alphabet="abcd"):
    out = []
    for _ in range(num_examples):
        s = "".join(rng.choice(alphabet) for _ in range(length))
        out.append(Example(s + "=", s[::-1], columns={"solution": s[::-1], "level": 3}))
    return out

def raises(completions, **kwargs):
    raise KeyError("no score")

def one_value(completions, **kwargs):
    return [1.0]

def words(prompt, completion, answer):
    return "high"

async def later(completions, **kwargs):
    return [1.0] * len(completions)

def needs_hint(completions, hint, **kwargs):
    return [0.0] * len(completions)
"""

#: A module whose import creates the marker file: nothing of it may run.
EVIL = """
open({marker!r}, "w").close()
def score(prompts, completions, **kwargs):
    open({marker!r}, "w").close()
    return [1.0] * len(completions)
"""

MARKED = """
from art_hydra import reward
@reward
def fine(prompt, completion, answer):
    return 1.0
"""


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "myrew.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _bound(fn, name: str, weight: float = 1.0) -> BoundReward:
    how = calling(fn)
    assert not isinstance(how, str), how
    return BoundReward(fn, RewardSpec("task.rewards.0._target_", f"m.{name}", weight, name), how)


def _world(overrides: list[str]) -> dict[str, list]:
    found: dict[str, list] = {}
    for p in world_problems(compose(overrides), None):
        found.setdefault(p.key, []).append(p)
    return found


# ---- scoring through the Example interface (fast) -------------------------------------


def test_a_trl_reward_gets_the_rows_columns_and_text_completions(mod: Path) -> None:
    import myrew

    rows = [
        Example("abc=", "cba", columns={"solution": "cba"}),
        Example("ab=", None, columns={"solution": "ba"}),
    ]
    scores = score_rewards([_bound(myrew.acc, "acc")], [(rows[0], "cba"), (rows[1], "xx")], 5)
    assert scores.totals == [1.0, 0.0]


def test_a_conversational_row_gives_messages_as_trl_does(mod: Path) -> None:
    seen: dict = {}

    def spy(prompts, completions, completion_ids, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, kw=kwargs)
        seen["step"] = trainer_state.global_step
        return [0.5] * len(completions)

    row = Example("hi", "yo", messages=(("system", "be brief"), ("user", "hi")), columns={"k": 1})
    score_rewards([_bound(spy, "spy")], [(row, "yo")], 5, completion_ids=[[7, 8]], global_step=3)
    assert seen["prompts"] == [
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    ]
    assert seen["completions"] == [[{"role": "assistant", "content": "yo"}]]
    assert seen["ids"] == [[7, 8]] and seen["step"] == 3
    assert seen["kw"] == {"k": [1], "answer": ["yo"]}


def test_weights_sum_and_none_skips_like_trl(mod: Path) -> None:
    import myrew

    row = Example("abc=", "cba")
    pairs = [(row, "cba"), (row, "cb")]  # lengths 3 (odd) and 2 (even: odd_only says None)
    scores = score_rewards(
        [_bound(myrew.length, "length", 2.0), _bound(myrew.odd_only, "odd_only", 0.5)], pairs, 5
    )
    assert scores.per_reward == [[3 / 8, 2 / 8], [1.0, None]]
    assert scores.totals == [2 * 3 / 8 + 0.5, 2 * 2 / 8]

    def never(prompts, completions):
        return [None] * len(completions)

    alone = score_rewards([_bound(never, "never")], pairs, 5)
    assert alone.totals == [0.0, 0.0] and alone.none_all == 2  # TRL's nansum: 0


def test_a_batched_reward_returning_the_wrong_count_is_named(mod: Path) -> None:
    import myrew

    row = Example("abc=", "cba")
    with pytest.raises(RewardError) as info:
        score_rewards([_bound(myrew.one_value, "one_value")], [(row, "a"), (row, "b")], 5)
    assert "m.one_value (task.rewards.0._target_) returned 1 value for 2 completions" in str(
        info.value
    )


def test_per_sample_rewards_get_only_what_they_name(mod: Path) -> None:
    def by_level(completion, level):
        return float(level)

    row = Example("abc=", "cba", columns={"level": 2, "other": "x"})
    assert score_rewards([_bound(by_level, "by_level")], [(row, "c")], 5).totals == [2.0]


# ---- the composed config --------------------------------------------------------------


def test_hydra_list_overrides_compose() -> None:
    cfg = compose(
        [
            "task.rewards=[{_target_: myrew.length, weight: 1.0},"
            "{_target_: myrew.acc, weight: 0.5}]",
            "task.rewards.0.weight=2",
        ]
    )
    assert [(r._target_, r.weight) for r in cfg.task.rewards] == [
        ("myrew.length", 2.0),
        ("myrew.acc", 0.5),
    ]


def test_the_shorthand_and_the_list_both_by_hand_are_refused_with_one_fix() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["task.reward._target_=myrew.length", "task.rewards=[{_target_: myrew.acc}]"])
    (problem,) = [p for p in info.value.problems if p.key == "task.reward._target_"]
    assert "replaces task.reward" in problem.reason
    assert "task.rewards=[{_target_: myrew.length, weight: 1.0}, {_target_: myrew.acc" in str(
        problem.fix.render()
    )


def test_two_rewards_with_one_name_are_refused() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["task.rewards=[{_target_: a.score},{_target_: b.score}]"])
    assert "task.rewards.1.name" in {p.key for p in info.value.problems}


# ---- the world pre-flight calls every reward on real rows -----------------------------


def test_good_rewards_pass_the_preflight(mod: Path) -> None:
    found = _world(
        [
            "task.generator=myrew.examples",
            "task.rewards=[{_target_: myrew.acc},{_target_: myrew.length, weight: 0.5},"
            "{_target_: myrew.odd_only}]",
        ]
    )
    assert found == {}


@pytest.mark.parametrize(
    ("name", "words"),
    [
        ("raises", "raised KeyError"),
        ("one_value", "returned 1 value for 4 completions"),
        ("words", "returned 'high' (str), not a number"),
        ("later", "coroutine function (async def)"),
    ],
)
def test_the_preflight_refuses_a_reward_that_cannot_score(mod: Path, name: str, words: str) -> None:
    found = _world(
        [
            "task.generator=myrew.examples",
            f"task.rewards=[{{_target_: myrew.length}},{{_target_: myrew.{name}}}]",
        ]
    )
    (problem,) = found["task.rewards.1._target_"]
    assert words in problem.reason and problem.value == f"myrew.{name}"
    assert set(found) == {"task.rewards.1._target_"}


def test_a_reward_naming_a_column_the_data_lacks_is_a_data_problem(mod: Path) -> None:
    found = _world(["task.generator=myrew.examples", "task.rewards=[{_target_: myrew.needs_hint}]"])
    (problem,) = found["task.generator"]
    assert "takes the column 'hint'" in problem.reason
    assert "level, solution" in problem.reason  # the columns the rows have


# ---- trust: the list cannot widen what a config file may run --------------------------


def _experiment(config_dir: Path, body: str) -> None:
    (config_dir / "experiment").mkdir(parents=True, exist_ok=True)
    (config_dir / "experiment" / "shared.yaml").write_text("# @package _global_\n" + body)


def test_an_unmarked_reward_in_a_config_files_list_is_refused_unimported(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (tmp_path / "good.py").write_text(MARKED)
    _experiment(
        tmp_path / "conf",
        "task:\n  rewards:\n    - _target_: good.fine\n"
        "    - _target_: evil.score\n      weight: 2\n",
    )
    for extra in ([], ["task.rewards.1.weight=3"], ["task.reward._target_=good.fine"]):
        proc = run_cli(
            "--config-dir",
            str(tmp_path / "conf"),
            "experiment=shared",
            *extra,
            cwd=tmp_path,
            env={"PYTHONPATH": str(tmp_path)},
        )
        out = output_of(proc)
        assert proc.returncode == 1, out
        assert "task.rewards.1._target_ = evil.score" in out and "not marked as a reward" in out
        assert "task.rewards.0._target_" not in out  # the marked one is fine
        assert "Traceback" not in out
        assert not marker.exists()
        assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "params",
    [
        "      task.rewards.0._target_: evil.score\n",
        "      task.rewards: '[{_target_: evil.score}], [{_target_: good.fine}]'\n",
    ],
)
def test_a_sweep_over_the_list_in_a_config_file_is_not_the_users_hand(
    tmp_path: Path, params: str
) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "evil.py").write_text(EVIL.format(marker=str(marker)))
    (tmp_path / "good.py").write_text(MARKED)
    _experiment(
        tmp_path / "conf",
        "hydra:\n  sweeper:\n    params:\n"
        + params
        + "task:\n  rewards:\n    - _target_: good.fine\n",
    )
    proc = run_cli(
        "-m",
        "--config-dir",
        str(tmp_path / "conf"),
        "experiment=shared",
        "dry_run=true",
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path)},
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "task.rewards.0._target_ = evil.score" in out and "not marked as a reward" in out
    assert "Traceback" not in out
    assert not marker.exists()


def test_a_library_gadget_in_the_list_is_refused_whoever_names_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["task.rewards=[{_target_: numpy.load}]"])
    assert "task.rewards.0._target_" in {p.key for p in info.value.problems}
    _experiment(tmp_path, "task:\n  rewards:\n    - _target_: os.system\n")
    with pytest.raises(ConfigValidationError) as info:
        compose(["experiment=shared"], config_dir=str(tmp_path))
    assert "task.rewards.0._target_" in {p.key for p in info.value.problems}


def test_the_same_list_on_the_command_line_runs_from_the_working_folder(tmp_path: Path) -> None:
    """``art-hydra`` imports a module of the working folder as ``python -m`` does (no
    PYTHONPATH), and an unmarked function the user typed is their own choice."""
    (tmp_path / "myrew.py").write_text(MODULE)
    proc = run_cli(
        "task.generator=myrew.examples",
        "task.rewards=[{_target_: myrew.acc},{_target_: myrew.length}]",
        "dry_run=true",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "reward: myrew.acc" in out and "reward: myrew.length" in out


def test_a_library_named_file_in_the_working_folder_is_never_imported(tmp_path: Path) -> None:
    """The working folder comes last on the import path: a ``datasets.py`` or
    ``jinja2.py`` lying there does not replace the library art_hydra imports (it would run
    unmarked and unchosen), while the user's own reward module there is still found."""
    payload = f"import pathlib\npathlib.Path({str(tmp_path / 'PWNED')!r}).touch()\n"
    for name in ("datasets", "jinja2", "pyarrow", "tokenizers"):
        (tmp_path / f"{name}.py").write_text(payload)
    (tmp_path / "myrew.py").write_text(MODULE)
    (tmp_path / "data.jsonl").write_text('{"prompt": "ab=", "solution": "ba"}\n' * 4)
    proc = run_cli(
        "task=dataset",
        "task.path=data.jsonl",
        "task.rewards=[{_target_: myrew.acc}]",
        "dry_run=true",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert not (tmp_path / "PWNED").exists(), out
    assert proc.returncode == 0 and "reward: myrew.acc" in out, out


def test_a_resume_names_the_reward_of_the_list_whose_source_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from art_hydra.runs import run_identity

    module = tmp_path / "resumed_rewards.py"  # a name no other test imports
    module.write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    overrides = [
        "task.generator=resumed_rewards.examples",
        "task.rewards=[{_target_: resumed_rewards.acc},{_target_: resumed_rewards.length}]",
    ]
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_identity.record(compose(overrides), run_dir)
    module.write_text(MODULE.replace("/ 8", "/ 16"))
    found = {p.key: p for p in run_identity.resume_problems(compose(overrides), run_dir)}
    changed = found["task.rewards.1._target_"]
    assert "source changed" in changed.reason and changed.value == "resumed_rewards.length"
    assert found["task.rewards.0._target_"].severity.value == "warning"  # same function


# ---- a run: each reward logged on its own ---------------------------------------------


@pytest.mark.slow
def test_each_reward_is_logged_next_to_the_total(tmp_path: Path) -> None:
    (tmp_path / "myrew.py").write_text(MODULE)
    proc = run_cli(
        "task.generator=myrew.examples",
        "task.rewards=[{_target_: myrew.acc, weight: 1.0},"
        "{_target_: myrew.length, weight: 0.5, name: len},{_target_: myrew.odd_only}]",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=16",
        "logging.progress_bar=off",
        "logging.plot=false",
        "hydra.run.dir=run",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [1, 2]
    for line in lines:
        for name in ("acc", "len", "odd_only"):
            assert f"reward/{name}/mean" in line and f"reward/{name}/std" in line
        assert line["reward/acc/count"] == line["reward/len/count"] == 16
        assert 0 <= line["reward/odd_only/count"] <= 16
    samples = (tmp_path / "run" / "completions.jsonl").read_text()
    assert '"rewards": {"acc"' in samples
