"""``trainer.num_train_epochs`` sizes a run from its data: the world pre-flight counts
real data files and records the steps as ``trainer.max_steps`` (RL and SFT, one rank or
two by config); a set ``trainer.max_steps`` wins with a warning; data of unknown size
is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import output_of, problem_about, report_entries
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.config.composition import check
from art_hydra.config.problems import Severity
from art_hydra.config.run_length import set_aside_note
from art_hydra.config.schema import DEFAULT_MAX_STEPS, RunConfig
from art_hydra.preflight import world_problems

pytestmark = pytest.mark.fast

BY_EPOCHS = ["trainer.max_steps=null"]


def _data(tmp_path: Path, rows: int, name: str = "data.jsonl") -> Path:
    """``rows`` lines of distinct prompts, each with an answer (SFT needs one)."""
    path = tmp_path / name
    lines = (json.dumps({"prompt": f"{i:03d}=", "answer": "a"}) for i in range(rows))
    path.write_text("\n".join(lines) + "\n")
    return path


def _sized(tmp_path: Path, rows: int, *overrides: str) -> tuple[int, list]:
    """The steps the world pre-flight records for a jsonl task of ``rows`` lines."""
    path = _data(tmp_path, rows)
    cfg = compose(["task=jsonl", f"task.path={path}", *BY_EPOCHS, *overrides])
    assert cfg.trainer.max_steps is None
    found = world_problems(cfg, None)
    assert not [p for p in found if p.is_error], found
    return cfg.trainer.max_steps, found


RL16 = ["trainer.per_device_train_batch_size=16"]  # 2 prompt groups of 8 per step
SFT = ["algorithm=sft", "trainer.per_device_train_batch_size=4"]


@pytest.mark.parametrize(
    ("rows", "overrides", "steps"),
    [
        (50, [*RL16, "trainer.num_train_epochs=1"], 25),  # 2 prompts a step
        (51, [*RL16, "trainer.num_train_epochs=1"], 26),  # a partial step rounds up
        (50, [*RL16, "trainer.num_train_epochs=3"], 75),
        (50, [*RL16, "trainer.num_train_epochs=0.5"], 13),  # 12.5 steps, rounded up
        (30, [*RL16, "trainer.num_train_epochs=0.1"], 2),  # 1.5: exact decimals, not 0.1's float
        # two ranks by config: 4 prompts a step
        (50, [*RL16, "distributed.world_size=2", "trainer.num_train_epochs=1"], 13),
        # generation batches of 2 x 2 = 4 prompts, each trained 2 x 2 = 4 steps: 13 of them
        (
            50,
            [
                *RL16,
                "rl.steps_per_generation=2",
                "rl.num_iterations=2",
                "trainer.num_train_epochs=1",
            ],
            52,
        ),
        # eval.fraction holds 10 of the 50 prompts out: 40 train
        (50, [*RL16, "eval.fraction=0.2", "trainer.num_train_epochs=1"], 20),
        (50, [*SFT, "trainer.num_train_epochs=1"], 13),  # 4 examples a step
        (50, [*SFT, "trainer.gradient_accumulation_steps=2", "trainer.num_train_epochs=1"], 7),
        (50, [*SFT, "distributed.world_size=2", "trainer.num_train_epochs=2.5"], 16),
    ],
)
def test_the_pre_flight_sizes_the_run_from_the_data(
    tmp_path: Path, rows: int, overrides: list[str], steps: int
) -> None:
    assert _sized(tmp_path, rows, *overrides)[0] == steps


def test_neither_set_is_the_default_run_length(tmp_path: Path) -> None:
    cfg = compose(["trainer.max_steps=null"])
    world_problems(cfg, None)
    assert cfg.trainer.max_steps == 100


def test_the_default_job_by_epochs_through_the_command(cli) -> None:
    """2,000 generated prompts, 16 a step: 125 steps an epoch, recorded as max_steps."""
    proc = cli("trainer.max_steps=null", "trainer.num_train_epochs=2", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "  max_steps: 250\n" in proc.stdout and "  num_train_epochs: 2.0\n" in proc.stdout
    assert "warning" not in out


def test_typed_epochs_set_a_files_max_steps_aside(cli) -> None:
    """The tiny model's training settings set trainer.max_steps=300; epochs the user types
    size the run (2,000 prompts, 16 a step: 125 steps), and the dry run says so."""
    proc = cli("trainer.num_train_epochs=1", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "  max_steps: 125\n" in proc.stdout and "warning" not in out
    assert "trainer.max_steps a config file set was set aside" in proc.stdout


def test_a_typed_max_steps_wins_and_the_warning_names_the_override(cli) -> None:
    proc = cli("trainer.num_train_epochs=1", "trainer.max_steps=300", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 0, out
    [(key, value, fixes)] = report_entries(out)
    assert (key, value) == ("trainer.num_train_epochs", "1.0")
    assert "trainer.max_steps=300 is set too, and wins" in out
    assert fixes.startswith("trainer.max_steps=null")
    assert "  max_steps: 300\n" in proc.stdout and "set aside" not in out
    # The override the warning names sizes the run by epochs, without a warning.
    again = cli("trainer.num_train_epochs=1", "trainer.max_steps=null", "dry_run=true")
    assert again.returncode == 0 and "  max_steps: 125\n" in again.stdout
    assert "warning" not in output_of(again)


def test_both_from_config_files_max_steps_wins(tmp_path: Path) -> None:
    """A config file that sets both: its max_steps wins, with the warning; the same
    epochs typed set it aside (compose's overrides are the user's hand, as the CLI's)."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "mine.yaml").write_text(
        "defaults:\n  - config\n  - _self_\ntrainer:\n  max_steps: 40\n  num_train_epochs: 1\n"
    )
    cfg = compose(config_name="mine", config_dir=str(conf))
    assert cfg.trainer.max_steps == 40
    problem = problem_about(check(cfg)[1], "trainer.num_train_epochs")
    assert problem.severity == Severity.warning
    typed = compose(["trainer.num_train_epochs=1"], config_name="mine", config_dir=str(conf))
    assert typed.trainer.max_steps is None and set_aside_note(typed)
    mine = compose(["trainer.max_steps=40"], config_name="mine", config_dir=str(conf))
    assert mine.trainer.max_steps == 40 and set_aside_note(mine) is None


def test_max_steps_is_null_only_when_epochs_size_the_run() -> None:
    """A reader of trainer.max_steps gets an int unless epochs size the run: composed
    (with a model whose settings set no length), built by hand, or nulled by hand."""
    assert compose(["model=qwen2_5_0_5b_instruct"]).trainer.max_steps == DEFAULT_MAX_STEPS
    assert compose(["trainer.max_steps=null"]).trainer.max_steps == DEFAULT_MAX_STEPS
    typed, problems = check(OmegaConf.structured(RunConfig))  # model.name ??? aside
    assert typed.trainer.max_steps == DEFAULT_MAX_STEPS
    assert not [p for p in problems if p.key.startswith("trainer.")]


def test_a_batch_smaller_than_a_group_gets_the_report_not_a_traceback(cli) -> None:
    """4 completions make no whole group of 8: the batch's own error, with epochs sizing
    the run (nothing to count: a step would consume no prompt); a sweep the same."""
    args = ("trainer.max_steps=null", "trainer.num_train_epochs=1", "dry_run=true")
    proc = cli("trainer.per_device_train_batch_size=4", *args)
    out = output_of(proc)
    assert proc.returncode != 0 and "Traceback" not in out, out
    [(key, value, _)] = report_entries(out)
    assert (key, value) == ("trainer.per_device_train_batch_size", "4")
    sweep = cli("-m", "trainer.per_device_train_batch_size=4,16", *args)
    out = output_of(sweep)
    assert sweep.returncode != 0 and "Traceback" not in out, out
    assert "1 of 2 sweep point(s) cannot run" in out
    assert [k for k, _, _ in report_entries(out)] == ["trainer.per_device_train_batch_size"]


def test_a_length_from_the_default_is_checked_whole_generations() -> None:
    """trainer.max_steps=null with neither key set is the default 100 steps, which 3
    steps per generation do not divide: the warning a set 100 gets."""
    _, problems = check(compose(["trainer.max_steps=null", "rl.steps_per_generation=3"]))
    problem = problem_about(problems, "trainer.max_steps")
    assert problem.severity == Severity.warning and problem.value == DEFAULT_MAX_STEPS


def test_a_finished_run_sized_by_epochs_is_continued_by_epochs(tmp_path: Path) -> None:
    """What resume=auto says of a finished run names the key that sized it."""
    from art_hydra.run import _further

    task = ["task=jsonl", f"task.path={_data(tmp_path, 50)}", *RL16]
    cfg = compose([*task, "trainer.num_train_epochs=1"])  # tiny.yaml's 300 set aside
    world_problems(cfg, None)
    assert cfg.trainer.max_steps == 25
    assert "trainer.num_train_epochs=<more than 1>" in _further(cfg, 25)
    assert "trainer.max_steps=<more than 9>" in _further(compose([*task, "trainer.max_steps=9"]), 9)


def test_the_count_streams_and_holds_out_as_the_run_does(tmp_path: Path) -> None:
    """Repeated prompts go wholly to one side: the count is the run's own split's."""
    from art_hydra.preflight.epochs import training_examples
    from art_hydra.tasks.base import data_rules, iter_examples
    from art_hydra.tasks.held_out import split_examples
    from art_hydra.tasks.jsonl import Scan

    path = tmp_path / "rep.jsonl"
    rows = [{"prompt": f"{i % 17:02d}=", "answer": "a"} for i in range(60)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = compose(["task=jsonl", f"task.path={path}", "eval.fraction=0.3", *RL16])
    examples = [ex for _, ex in iter_examples(cfg, Scan(), data_rules(cfg, ()))]
    train, _ = split_examples(examples, 0.3, cfg.seed)
    assert training_examples(cfg) == len(train) < 60


def test_rules_on_the_run_length_are_checked_on_the_count(tmp_path: Path) -> None:
    steps, found = _sized(
        tmp_path, 20, *RL16, "trainer.num_train_epochs=1", "trainer.warmup_steps=10"
    )
    assert steps == 10
    (warmup,) = [p for p in found if p.key == "trainer.warmup_steps"]
    assert warmup.severity == Severity.warning
    assert "10 steps, from trainer.num_train_epochs=1" in warmup.reason


def test_data_of_unknown_size_is_refused(tmp_path: Path) -> None:
    card = tmp_path / "card"
    card.mkdir()
    (card / "local.jsonl").write_text(json.dumps({"prompt": "ab=", "answer": "ba"}) + "\n")
    (card / "README.md").write_text(
        "---\nconfigs:\n- config_name: default\n  data_files:\n"
        "  - split: train\n    path:\n    - hf://datasets/someone/data/train.parquet\n---\n"
    )
    overrides = ["task=dataset", f"task.path={card}", "task.allow_remote_data=true"]
    cfg = compose([*overrides, *BY_EPOCHS, "trainer.num_train_epochs=1"])
    found = world_problems(cfg, None)
    (refused,) = [p for p in found if p.key == "trainer.num_train_epochs"]
    assert refused.is_error and "remote data files" in refused.reason
    assert "trainer.max_steps=<optimizer steps>" in " ".join(refused.fix.overrides())
    assert cfg.trainer.max_steps is None
    # A length in steps needs no count.
    cfg = compose([*overrides, "trainer.max_steps=5", "trainer.num_train_epochs=1"])
    assert not [p for p in world_problems(cfg, None) if p.key.startswith("trainer.")]
