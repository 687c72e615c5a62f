"""A report's fixes hold as a chain: a fix that only deletes is pasteable Hydra (``~key``),
a refused config's report lists what its fixes would reveal, and a pasted fix replaces
what it names on the command line. The real command runs where the report's text is the
point; the corpus of tests/config/test_fixes_work.py checks every kind of problem."""

from __future__ import annotations

import importlib.util
import json
import shlex
from pathlib import Path

import pytest
from conftest import output_of, report_entries, write_model_files

from art_hydra.config.composition import compose
from art_hydra.config.fix_chain import applied, follow, repeats, settled
from art_hydra.config.problems import (
    ConfigValidationError,
    Fix,
    Problem,
    fix,
    format_report,
    placeholder,
)

REVEALED = "Once the fixes above are applied"


def _fix_of(out: str, key: str) -> list[str]:
    """The overrides of the report's fix for ``key``, as a shell would split them."""
    found = [f for k, _, f in report_entries(out) if k == key]
    assert found, out
    return shlex.split(found[0])


# ---- rendering ----------------------------------------------------------------------


def test_a_dropped_key_not_set_again_renders_as_a_hydra_deletion() -> None:
    assert fix({"trainer.learning_rate": 1e-5}, drops=("trainer.lerning_rate",)).render() == (
        "trainer.learning_rate=1e-05 ~trainer.lerning_rate"
    )
    assert fix(drops=("algorithm.loss",)).render() == "~algorithm.loss"
    # A key the fix sets again is replaced, not deleted.
    assert fix({"backend": "torch"}, "drop the '+'", drops=("backend",)).render() == (
        "backend=torch (drop the '+')"
    )
    # The user's own deletion: nothing appended undoes it, the note says what to do.
    assert fix(note="drop the '~trainer' override", drops=("~trainer",)).render() == (
        "drop the '~trainer' override"
    )


# ---- the pasted fix on the real command ----------------------------------------------


@pytest.mark.parametrize(
    ("given", "key"),
    [
        (["+trainer.lerning_rate=1e-5"], "trainer.lerning_rate"),
        (["algorithm.loss=cisp"], "algorithm.loss"),
    ],
)
def test_a_misspelt_key_is_told_a_fix_that_pastes_after_the_command(
    cli, given: list[str], key: str
) -> None:
    refused = cli(*given)
    assert refused.returncode == 1 and "Traceback" not in output_of(refused)
    remedy = _fix_of(refused.stderr, key)
    assert f"~{key}" in remedy, refused.stderr
    pasted = cli(*given, *remedy, "dry_run=true")
    assert pasted.returncode == 0, output_of(pasted)
    assert "the configuration is valid" in pasted.stdout


def test_the_cisp_chain_is_named_in_the_first_report(cli) -> None:
    refused = cli("rl.loss_type=cisp")
    out = refused.stderr
    assert refused.returncode == 1 and "(1 problem)" in out and REVEALED in out, out
    keys = [k for k, _, _ in report_entries(out)]
    assert keys == ["rl.loss_type", "rl.epsilon_high"], out
    # Every fix of the report, pasted together, gives a config that runs.
    remedies = [*_fix_of(out, "rl.loss_type"), *_fix_of(out, "rl.epsilon_high")]
    pasted = cli("rl.loss_type=cisp", *remedies, "dry_run=true")
    assert pasted.returncode == 0, output_of(pasted)


@pytest.mark.skipif(importlib.util.find_spec("wandb") is None, reason="needs wandb installed")
def test_a_misspelt_tracker_reveals_what_the_tracker_itself_needs(cli) -> None:
    """``[wandbb]`` is told ``[wandb]``; with wandb installed and no key, the same report
    says it would run online without one."""
    env = {"WANDB_MODE": "", "WANDB_API_KEY": "", "NETRC": "/nonexistent/netrc"}
    refused = cli("logging.report_to=[wandbb]", env=env)
    out = refused.stderr
    assert refused.returncode == 1 and REVEALED in out, out
    assert [k for k, _, _ in report_entries(out)] == ["logging.report_to"] * 2, out


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_a_misspelt_tracker_reveals_that_it_is_not_installed(cli) -> None:
    refused = cli("logging.report_to=[wandbb]")
    out = refused.stderr
    assert refused.returncode == 1 and REVEALED in out and "wandb" in out, out


def test_a_model_folder_under_the_tiny_model_reveals_its_too_long_prompts(
    cli, tmp_path: Path
) -> None:
    """``model.name=<folder>`` is told ``model=pretrained``; the same report says the
    task's prompts, in the folder's chat template, do not fit its positions."""
    folder = write_model_files(
        tmp_path / "mine",
        {"model_type": "llama", "max_position_embeddings": 40, "vocab_size": 103},
    )
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}You are a helpful assistant; answer briefly and well. "
        "{{ m['content'] }}{% endfor %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    refused = cli(f"model.name={folder}")
    out = refused.stderr
    assert refused.returncode == 1 and "(1 problem)" in out and REVEALED in out, out
    keys = [k for k, _, _ in report_entries(out)]
    assert keys[0] == "model.name" and "rl.max_prompt_length" in keys[1:], out


def test_an_accepted_config_reveals_nothing(cli) -> None:
    ran = cli("rl.loss_type=cispo", "rl.epsilon_high=5.0", "dry_run=true")
    assert ran.returncode == 0 and REVEALED not in output_of(ran)


# ---- compose() -----------------------------------------------------------------------


def test_compose_lists_what_the_fixes_reveal() -> None:
    with pytest.raises(ConfigValidationError) as raised:
        compose(["rl.loss_type=cisp"])
    assert [p.key for p in raised.value.problems if p.is_error] == ["rl.loss_type"]
    assert [(r, p.key) for r, p in raised.value.revealed] == [(1, "rl.epsilon_high")]
    assert REVEALED in str(raised.value)


def test_compose_takes_a_pasted_deletion() -> None:
    cfg = compose(
        ["+trainer.lerning_rate=1e-5", "trainer.learning_rate=1e-05", "~trainer.lerning_rate"]
    )
    assert cfg.trainer.learning_rate == 1e-5


# ---- the pieces ------------------------------------------------------------------------


def test_a_later_override_settles_the_earlier_ones_it_replaces() -> None:
    assert settled(
        ["+trainer.lerning_rate=1", "trainer.learning_rate=1", "~trainer.lerning_rate"]
    ) == ["trainer.learning_rate=1"]
    assert settled(["+backend=torch", "backend=torch"]) == ["backend=torch"]
    assert settled(["task.rewards.0.weight=2", "task.rewards=[{_target_: m.f}]"]) == [
        "task.rewards=[{_target_: m.f}]"
    ]
    # A key the command line added stays added once its value is replaced.
    assert settled(["+task.params.foo=1", "task.params.foo=2"]) == ["++task.params.foo=2"]
    assert settled(["++task.params.foo=1", "task.params.foo=2"]) == ["++task.params.foo=2"]


@pytest.mark.parametrize(
    "line",
    [
        # A schema key cannot be deleted: Hydra refuses it, and so is it refused here.
        ["trainer.learning_rate=1", "~trainer.learning_rate"],
        # An open mapping's key is deleted by Hydra itself (its preset may hold it).
        ["++task.params.n=1", "~task.params.n"],
        # Group choices apply before values: a later group keeps the earlier values.
        ["model.name=x", "model=tiny"],
        # A section merges key by key: its keys set before stay.
        ["trainer.learning_rate=1", "trainer={max_steps: 2}"],
        # A sweep is not a last word, nor is a value a sweep covers.
        ["trainer.max_steps=1", "trainer.max_steps=2,3"],
        ["trainer.max_steps=2,3", "trainer.max_steps=1"],
        # A mapping given to a group's key merges into the chosen option.
        ["task=jsonl", "task={path: /data.jsonl}"],
        ["model=pretrained", "model={name: /a/folder}"],
        # A mapping field merges key by key too.
        ["task.params.length=5", "task.params={alphabet: xy}"],
        # A package's choice is its own.
        ["model@x=tiny", "model=pretrained"],
    ],
)
def test_a_command_line_hydra_reads_keeps_its_meaning(line: list[str]) -> None:
    assert settled(line) == line


def test_a_fix_applied_replaces_what_it_names() -> None:
    remedy = fix({"trainer.learning_rate": 1e-5}, drops=("trainer.lerning_rate",))
    assert applied(["+trainer.lerning_rate=1e-5", "seed=3"], remedy) == [
        "seed=3",
        "trainer.learning_rate=1e-05",
    ]


def test_a_fix_that_repeats_the_value_is_found() -> None:
    same = Problem("eval.fraction", 0.5, "holds out no prompt", fix({"eval.fraction": 0.5}))
    assert repeats(same, None, ["eval.fraction=0.5"])
    other = Problem("eval.fraction", 0.5, "holds out no prompt", fix({"eval.fraction": 0}))
    assert not repeats(other, None, ["eval.fraction=0.5"])
    typed = Problem(
        "trainer.learning_rate", "abc", "wrong type", fix({"trainer.learning_rate": 5e-4})
    )
    assert not repeats(typed, None, ["trainer.learning_rate=abc"])
    unfilled = Problem("model.name", "???", "missing", fix({"model.name": placeholder("value")}))
    assert not repeats(unfilled, None, [])


def test_the_chain_flags_a_fix_that_does_not_hold() -> None:
    """A check that keeps refusing whatever is applied: the fix is flagged, nothing is
    revealed, and the chain stops."""
    stuck = Problem("seed", 3, "never fits", fix({"seed": 4}))
    chain = follow([stuck], None, ["seed=3"], lambda overrides: ([stuck], None))
    assert chain.stuck == [stuck] and chain.revealed == []


def test_the_chain_is_bounded() -> None:
    """A check that reveals a new problem every time stops after the rounds allowed."""
    calls: list[list[str]] = []

    def check(overrides: list[str]) -> tuple[list[Problem], None]:
        calls.append(overrides)
        n = len(calls)
        return [Problem(f"k{n}", n, "new", fix({f"k{n}": n + 1}))], None

    chain = follow([Problem("k0", 0, "first", fix({"k0": 1}))], None, [], check, rounds=3)
    assert len(calls) == 3 and [r for r, _ in chain.revealed] == [1, 2, 3]


def test_the_report_marks_revealed_problems_after_the_errors() -> None:
    first = Problem("rl.loss_type", "cisp", "is not a loss.", fix({"rl.loss_type": "cispo"}))
    then = Problem("rl.epsilon_high", None, "is needed.", fix({"rl.epsilon_high": 5.0}))
    after = Problem("x", 1, "later.", Fix(note="do it"))
    text = format_report([first], revealed=[(1, then), (2, after)])
    assert text.index("1. rl.loss_type") < text.index(REVEALED) < text.index("2. rl.epsilon_high")
    assert "Once those fixes are applied too, 1 more problem appears:\n  3. x" in text
    assert text.startswith("The configuration cannot run (1 problem):")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("task.allowed_modules", ["mine"]),
        ("model.trust_remote_code", True),
        ("task.reward._target_", "mine.score"),
        ("task.rewards", [{"_target_": "mine.score", "weight": 1.0}]),
        ("hydra.callbacks", {}),
    ],
)
def test_the_chain_never_applies_a_fix_that_chooses_code(key: str, value: object) -> None:
    """Such a fix's value may come from a config file or a run's record: only the user's
    own paste may choose code, so the chain does not apply it (nor check past it)."""
    problem = Problem(key, None, "set by a config file", fix({key: value}))
    calls: list[list[str]] = []
    chain = follow([problem], None, [], lambda o: (calls.append(o), ([], None))[1])
    assert calls == [] and chain.revealed == []
