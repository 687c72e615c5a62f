"""The model's positions against what the run will feed it, decided before any model
loads: ``model=pretrained`` derives ``model.max_seq_length`` from the folder (no refusal
of a length the user never set), a length the user sets is still held to the positions,
and evaluation's prompts and completions are measured like the training data.

Fast tier (tests/preflight): tiny random-weight folders of real families, the real CLI
in a subprocess for the refusals a user meets first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, problem_about, report_entries, run_cli
from model_folders import char_tokenizer, gpt2_tokenizer, random_model

from art_hydra import Severity, compose
from art_hydra.config.typed import typed_config
from art_hydra.config.validators import derived_max_seq_length
from art_hydra.preflight import world_problems

#: Budgets that fit 48 tokens.
FITS = ("rl.max_prompt_length=16", "rl.max_completion_length=32")
DATA_ROWS = [{"prompt": f"ab{i}=", "answer": "ba"} for i in range(8)]


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Mistral folders of 512 and 64 positions, a GPT-2 of 32 (a learned position table:
    one position past it is an IndexError), and a JSONL file of eight distinct prompts."""
    root = tmp_path_factory.mktemp("positions")
    found = {}
    for name, positions in (("mistral512", 512), ("mistral64", 64)):
        folder = root / name
        random_model(folder, "mistral", char_tokenizer(folder), max_position_embeddings=positions)
        found[name] = folder
    found["gpt2"] = root / "gpt2"
    random_model(found["gpt2"], "gpt2", gpt2_tokenizer(found["gpt2"]), n_positions=32)
    found["data"] = root / "data.jsonl"
    found["data"].write_text("".join(json.dumps(row) + "\n" for row in DATA_ROWS))
    return found


def _pretrained(folders: dict[str, Path], model: str, *extra: str) -> list[str]:
    return [
        "model=pretrained",
        f"model.name={folders[model]}",
        "model.finetune=full",
        "task=jsonl",
        f"task.path={folders['data']}",
        *extra,
    ]


def _errors(overrides: list[str]) -> list:
    return [p for p in world_problems(compose(overrides), None) if p.is_error]


def test_model_pretrained_on_a_512_position_folder_is_accepted_by_the_cli(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """It was refused: the preset set model.max_seq_length=2048, which the user never set,
    "longer than the 512 positions". Null now derives 512 from config.json."""
    overrides = _pretrained(folders, "mistral512")
    proc = run_cli(*overrides, "dry_run=true", cwd=tmp_path)
    assert proc.returncode == 0, output_of(proc)
    assert "the configuration is valid" in output_of(proc)
    cfg = compose(overrides)
    assert cfg.model.max_seq_length is None
    assert derived_max_seq_length(cfg, 512) == 512
    sft = compose([*overrides, "algorithm=sft"])  # sft.max_length=1024: the data is short
    assert _errors([*overrides, "algorithm=sft"]) == [] and sft.sft.max_length > 512


def test_a_length_the_user_sets_past_the_positions_is_still_refused(
    folders: dict[str, Path],
) -> None:
    problems = world_problems(
        compose(_pretrained(folders, "mistral512", "model.max_seq_length=1024")), None
    )
    problem = problem_about(problems, "model.max_seq_length")
    assert problem.severity == Severity.error
    assert problem.fix.overrides() == ["model.max_seq_length=512"]


@pytest.mark.model  # imports the run's recipe, and with it torch
def test_the_run_derives_the_length_the_preflight_checked(folders: dict[str, Path]) -> None:
    """One function for both: the run settles null before anything reads it."""
    from art_hydra.engine.recipe import settle_max_seq_length

    run = typed_config(compose(_pretrained(folders, "mistral64", "rl.max_completion_length=32")))
    settle_max_seq_length(run)
    assert run.model.max_seq_length == 64
    # A hub id not in the cache: the budgets' room until the loaded config cuts it.
    hub = typed_config(compose(["model=pretrained", "model.name=acme/not-cached-anywhere"]))
    settle_max_seq_length(hub)
    assert hub.model.max_seq_length == 2048

    class Loaded:
        def to_dict(self) -> dict:
            return {"max_position_embeddings": 128}

    settle_max_seq_length(hub, Loaded())
    assert hub.model.max_seq_length == 128
    # Set by hand, or the tiny model's room: left as it is.
    mine = typed_config(
        compose(_pretrained(folders, "mistral64", "model.max_seq_length=48", *FITS))
    )
    settle_max_seq_length(mine)
    assert mine.model.max_seq_length == 48
    tiny = typed_config(compose([]))
    settle_max_seq_length(tiny)
    assert tiny.model.max_seq_length == 64


def test_derived_lengths_hold_the_data_not_the_default_budgets(
    folders: dict[str, Path],
) -> None:
    """64 positions: the 256-token prompt budget is never filled by prompts of 5 tokens,
    so 5 + 32 completion tokens fit; 5 + 100 do not, and the fix says 59."""
    assert _errors(_pretrained(folders, "mistral64", "rl.max_completion_length=32")) == []
    problem = problem_about(
        _errors(_pretrained(folders, "mistral64", "rl.max_completion_length=100")),
        "rl.max_completion_length",
    )
    assert "max_position_embeddings=64" in problem.reason
    assert problem.fix.overrides() == ["rl.max_completion_length=59"]


def test_sft_evaluation_past_the_positions_is_refused_by_the_cli_before_loading(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """SFT with eval.fraction generated rl.max_completion_length=256 tokens after each
    held-out prompt on a 32-position GPT-2: it trained, then died in an IndexError."""
    overrides = _pretrained(folders, "gpt2", "algorithm=sft", "eval.fraction=0.25")
    proc = run_cli(*overrides, "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    entries = report_entries(out)
    assert [e[0] for e in entries] == ["eval.max_completion_length"], out
    assert entries[0][2].startswith("eval.max_completion_length=28"), out
    assert "Traceback" not in out
    assert _errors([*overrides, "eval.max_completion_length=28"]) == []


def test_rl_evaluation_with_a_budget_of_its_own_is_held_to_the_positions(
    folders: dict[str, Path],
) -> None:
    base = _pretrained(folders, "mistral64", "rl.max_completion_length=32", "eval.fraction=0.25")
    assert _errors(base) == []
    problem = problem_about(
        _errors([*base, "eval.max_completion_length=100"]), "eval.max_completion_length"
    )
    assert problem.fix.overrides() == ["eval.max_completion_length=59"]


def test_eval_path_rows_are_checked_like_the_training_data(tmp_path: Path) -> None:
    """The tiny model's RL budgets against an eval.path prompt of 61 characters, and
    text its tokenizer reads as a special token: both named before anything loads."""
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(row) + "\n" for row in DATA_ROWS))
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"prompt": "ab" * 30 + "=", "answer": "ba"}) + "\n")
    base = ["task=jsonl", f"task.path={train}", "rl.max_prompt_length=16"]
    base += ["rl.max_completion_length=16"]
    problem = problem_about(_errors([*base, f"eval.path={evaluation}"]), "rl.max_prompt_length")
    assert str(evaluation) in problem.reason and "evaluated on" in problem.reason
    assert problem.fix.overrides()[0] == "rl.max_prompt_length=62"
    special = tmp_path / "special.jsonl"
    special.write_text(json.dumps({"prompt": "ab=", "answer": "b<eos>a"}) + "\n")
    problem = problem_about(_errors([*base, f"eval.path={special}"]), "eval.path")
    assert "special tokens" in problem.reason


def test_eval_path_prompts_past_the_positions_are_refused(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    evaluation = tmp_path / "eval.jsonl"
    evaluation.write_text(json.dumps({"prompt": "ab" * 20 + "=", "answer": "ba"}) + "\n")
    overrides = _pretrained(folders, "mistral64", "rl.max_completion_length=32")
    problem = problem_about(
        _errors([*overrides, f"eval.path={evaluation}"]), "eval.max_completion_length"
    )
    assert str(evaluation) in problem.reason
    fixed = [*overrides, f"eval.path={evaluation}", *problem.fix.overrides()]
    assert _errors(fixed) == []


def test_the_late_evaluation_refusal_names_a_key_that_can_be_set() -> None:
    """It said ``set rl.max_prompt_length (evaluation prompts)=N``, which is no key."""
    from art_hydra.engine.backends.tiny import build_tokenizer
    from art_hydra.engine.producer import encode_checked
    from art_hydra.tasks.examples import Example, TaskDataError

    with pytest.raises(TaskDataError) as caught:
        encode_checked(
            build_tokenizer(),
            [Example(prompt="abcdefgh")],
            4,
            "rl.max_prompt_length",
            "evaluation prompt(s) of eval.path=/data/eval.jsonl",
        )
    message = str(caught.value)
    assert "evaluation prompt(s) of eval.path=/data/eval.jsonl" in message
    assert "set rl.max_prompt_length=9 " in message
