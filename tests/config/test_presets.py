"""Presets that fit the model, and no silent settings (issue 18, items 4 and 5).

Model files set model keys only; each model option brings its own training settings
(conf/training/<model>.yaml), so the tiny model's never reach a pretrained run unseen. A
value the user set that the run never reads is a warning naming what makes it inert, or
an error where a path would be ignored; the shipped configs themselves never warn.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from conftest import output_of, problem_about, report_entries
from hydra.types import RunMode
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.config.composition import check, compose_and_check, make_loader
from art_hydra.config.problems import ConfigValidationError, Severity, warnings_of
from art_hydra.config.schema import FinetuneMethod, ModelSource
from art_hydra.config.validator_registry import registered_validators

CONF = Path(__file__).resolve().parents[2] / "conf"
INERT = "art_hydra.config.inert"


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def _check(overrides: list[str], config_dir: str | None = None) -> list:
    result = compose_and_check(make_loader(config_dir), "config", overrides, RunMode.RUN)
    return result.problems


def _file_task(task: str) -> bool:
    """A task option that reads a file (its YAML sets a source other than the generator)."""
    raw = OmegaConf.to_container(OmegaConf.load(CONF / "task" / f"{task}.yaml"))
    source = raw.get("source", raw.get("task", {}).get("source")) if isinstance(raw, dict) else None
    return source not in (None, "generated")


def _completing(model: str, task: str, data: Path) -> list[str]:
    extra = ["model.name=/models/mine"] if model == "pretrained" else []
    return extra + ([f"task.path={data}"] if _file_task(task) else [])


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "data.jsonl"
    path.write_text('{"prompt": "ab=", "answer": "ba"}\n')
    return path


def test_the_inert_rules_are_registered() -> None:
    assert any(name.startswith(INERT) for name in registered_validators())


def test_every_shipped_combination_and_experiment_composes_without_a_warning(data: Path) -> None:
    """Every model x task x algorithm, and every experiment: no warning at all (a shipped
    value never counts as the user's, and the budgets fit the model)."""
    points = [
        [f"model={m}", f"task={t}", f"algorithm={a}", *_completing(m, t, data)]
        for m, t, a in itertools.product(_options("model"), _options("task"), _options("algorithm"))
    ]
    points += [[f"experiment={e}"] for e in _options("experiment")]
    for overrides in points:
        problems = _check(overrides)
        assert problems == [], (overrides, problems)


@pytest.mark.parametrize("path", sorted((CONF / "model").glob("*.yaml")), ids=lambda p: p.stem)
def test_model_files_set_model_keys_only(path: Path) -> None:
    raw = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(raw, dict) and set(raw) == {"model"}, f"{path.name} sets {set(raw)}"


def test_the_default_run_keeps_the_tiny_models_training_settings() -> None:
    cfg = compose()
    assert cfg.model.source == ModelSource.tiny and cfg.model.finetune == FinetuneMethod.full
    assert (cfg.trainer.learning_rate, cfg.trainer.per_device_train_batch_size) == (1e-3, 128)
    assert (cfg.trainer.max_steps, cfg.trainer.lr_scheduler_type.name) == (300, "linear")
    assert cfg.model.max_seq_length == 64 and list(cfg.model.lora.modules_to_save) == ["lm_head"]


def test_the_pretrained_option_brings_none_of_the_tiny_settings() -> None:
    cfg = compose(["model=pretrained", "model.name=/models/mine"])
    assert cfg.model.source == ModelSource.pretrained and cfg.model.finetune == FinetuneMethod.lora
    assert cfg.trainer.learning_rate == 1e-5 and cfg.trainer.max_steps != 300
    assert cfg.trainer.lr_scheduler_type.name != "linear" or cfg.trainer.max_steps != 300
    assert list(cfg.model.lora.modules_to_save) == []
    assert cfg.model.max_seq_length is None  # derived from the model at the world check


def test_the_learning_rate_follows_the_finetuning_method_unless_set() -> None:
    base = ["model=pretrained", "model.name=/models/mine"]
    assert compose([*base, "model.finetune=full"]).trainer.learning_rate == 1e-6
    assert compose([*base, "trainer.learning_rate=3e-5"]).trainer.learning_rate == 3e-5
    llama = compose(["model=llama3_2_1b_instruct", "model.finetune=full"])
    assert llama.trainer.learning_rate == 1e-6


def test_pretrained_without_a_name_is_refused() -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose(["model=pretrained"])
    assert problem_about(info.value, "model.name").is_error


@pytest.mark.parametrize("algorithm", ["rl", "sft"])
def test_a_file_task_runs_with_the_default_model(algorithm: str, data: Path) -> None:
    """task=jsonl's budgets (256 + 256, or 1024 in SFT) get a tiny model that holds them."""
    cfg = compose(["task=jsonl", f"task.path={data}", f"algorithm={algorithm}"])
    need = (
        cfg.sft.max_length
        if algorithm == "sft"
        else cfg.rl.max_prompt_length + cfg.rl.max_completion_length
    )
    assert cfg.model.max_seq_length == need


def test_a_file_task_with_the_default_model_passes_the_cli(cli, data: Path) -> None:
    proc = cli("task=jsonl", f"task.path={data}", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)


@pytest.mark.parametrize(
    "name", ["Qwen/Qwen2.5-0.5B-Instruct", "/models/mine", "./mine", "models/mine"]
)
def test_a_model_path_under_the_tiny_source_is_refused_with_a_fix_that_works(name: str) -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose([f"model.name={name}"])
    problem = problem_about(info.value, "model.name")
    assert problem.is_error
    assert problem.fix.overrides() == ["model=pretrained", f"model.name={name}"]
    cfg = compose([f"model.name={name}", *problem.fix.overrides()])
    assert cfg.model.source == ModelSource.pretrained and cfg.model.name == name


def test_a_label_under_the_tiny_source_is_fine() -> None:
    assert _check(["model.name=my-tiny"]) == []


def test_a_model_folder_named_without_a_slash_is_a_path(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "mymodel").mkdir()
    (tmp_path / "mymodel" / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path)
    assert problem_about(_check(["model.name=mymodel"]), "model.name").is_error


def test_the_tiny_settings_in_a_pretrained_run_are_named() -> None:
    problems = _check(["model.source=pretrained", "model.name=/models/mine"])
    leak = problem_about(problems, "model.source")
    assert leak.severity == Severity.warning
    for named in (
        "trainer.learning_rate=0.001",
        "trainer.per_device_train_batch_size=128",
        "trainer.max_steps=300",
        "trainer.lr_scheduler_type=linear",
        "model.finetune=full",
        "model.max_seq_length=64",
        "model.lora.modules_to_save=[lm_head]",
    ):
        assert named in leak.reason, named
    assert leak.fix.overrides() == ["model=pretrained", "model.name=/models/mine"]


def test_a_leaked_setting_the_user_chose_is_not_named() -> None:
    problems = _check(["model.source=pretrained", "model.name=/m", "trainer.learning_rate=1e-3"])
    assert "trainer.learning_rate" not in problem_about(problems, "model.source").reason


INERT_CASES = [
    (["model.lora.r=8"], "model.lora.r", "model.finetune=full"),
    (["model.lora.target_modules=[q_proj]"], "model.lora.target_modules", "model.finetune=full"),
    (["algorithm=sft", "rl.beta=0.1"], "rl.beta", "algorithm=sft"),
    (["sft.max_length=30"], "sft.max_length", "algorithm=rl"),
    (["task=jsonl", "task.path={data}", "task.num_examples=5"], "task.num_examples", "jsonl"),
    (["task=jsonl", "task.path={data}", "+task.params.length=4"], "task.params.length", "jsonl"),
    (
        ["model=pretrained", "model.name=/m", "model.tiny.hidden_size=32"],
        "model.tiny.hidden_size",
        "model.source=pretrained",
    ),
    (["model.revision=main"], "model.revision", "model.source=tiny"),
    (["rl.loss_type=cispo", "rl.epsilon_high=5", "rl.epsilon=0.1"], "rl.epsilon", "cispo"),
]


@pytest.mark.parametrize(("overrides", "key", "because"), INERT_CASES)
def test_a_value_the_run_never_reads_is_a_warning_naming_why(
    overrides: list[str], key: str, because: str, data: Path
) -> None:
    overrides = [o.format(data=data) for o in overrides]
    problem = problem_about(_check(overrides), key)
    assert problem.severity == Severity.warning
    assert because in problem.reason and "never read" in problem.reason


ACTIVE_CASES = [
    ["model.finetune=lora", "model.lora.r=8"],
    ["rl.beta=0.1"],
    ["algorithm=sft", "sft.max_length=30"],
    ["task.num_examples=5", "task.params.length=4"],
    ["model.tiny.hidden_size=32"],
    ["model=pretrained", "model.name=/m", "model.revision=main"],
    ["rl.epsilon=0.1"],
]


@pytest.mark.parametrize("overrides", ACTIVE_CASES)
def test_the_same_values_where_the_run_reads_them_pass_quietly(overrides: list[str]) -> None:
    assert [p for p in _check(overrides) if p.severity == Severity.warning] == []


def test_a_data_path_the_run_would_ignore_is_refused_with_a_fix_that_works(data: Path) -> None:
    with pytest.raises(ConfigValidationError) as info:
        compose([f"task.path={data}"])
    problem = problem_about(info.value, "task.path")
    assert problem.is_error and "task.source=generated" in problem.reason
    cfg = compose([f"task.path={data}", *problem.fix.overrides()])
    assert cfg.task.source.name == "jsonl"


def test_a_users_own_config_file_counts_as_set(tmp_path: Path) -> None:
    mine = tmp_path / "mine" / "experiment"
    mine.mkdir(parents=True)
    (mine / "wide.yaml").write_text("# @package _global_\nmodel:\n  lora:\n    r: 64\n")
    problems = _check(["experiment=wide"], config_dir=str(tmp_path / "mine"))
    assert problem_about(problems, "model.lora.r").severity == Severity.warning


def test_a_python_callers_config_warns_only_on_values_of_its_own() -> None:
    """``train(cfg)`` validates again with no command line: shipped values stay quiet."""
    for overrides in ([], ["experiment=tiny_sft_reverse"], ["task=digit_sum"]):
        assert warnings_of(check(compose(overrides))[1]) == [], overrides
    cfg = compose([])
    cfg.model.lora.r = 4
    _, problems = check(cfg)
    assert [p.key for p in warnings_of(problems)] == ["model.lora.r"]


def test_a_shipped_config_never_warns_in_the_cli(cli) -> None:
    proc = cli("experiment=tiny_sft_reverse", "dry_run=true")
    assert proc.returncode == 0 and report_entries(output_of(proc)) == []


def test_logging_less_often_than_the_run_is_long_is_a_warning() -> None:
    problem = problem_about(
        _check(["trainer.max_steps=3", "logging.every_steps=10"]), "logging.every_steps"
    )
    assert problem.severity == Severity.warning and "only the last step" in problem.reason


def test_a_sweep_that_crosses_a_value_with_what_makes_it_inert_is_deliberate() -> None:
    """``-m algorithm=rl,sft rl.beta=0.1``: rl.beta is meant for the RL points."""
    from art_hydra.config import inert

    assert inert.swept_keys(["algorithm=rl,sft", "rl.beta=0.1", "seed=range(3)"]) == {
        "algorithm",
        "seed",
    }
    with inert.sweeping(frozenset({"algorithm"})):
        assert _check(["algorithm=sft", "rl.beta=0.1"]) == []
    with inert.sweeping(frozenset({"model.lora.r"})):
        assert _check(["model.lora.r=8"]) == []
    with inert.sweeping(frozenset({"seed"})):  # a sweep over seeds crosses nothing with it
        assert problem_about(_check(["model.lora.r=8"]), "model.lora.r").severity.name == "warning"


def test_full_finetuning_at_a_lora_rate_is_a_warning(tmp_path: Path) -> None:
    """A model option of the user's own has no training file: the schema's rate (1e-5,
    made for LoRA) under model.finetune=full is named; a rate set by hand is not."""
    mine = tmp_path / "mine" / "model"
    mine.mkdir(parents=True)
    (mine / "mymodel.yaml").write_text("# @package _global_\nmodel:\n  name: /models/mine\n")
    where = str(tmp_path / "mine")
    found = problem_about(
        _check(["model=mymodel", "model.finetune=full"], config_dir=where),
        "trainer.learning_rate",
    )
    assert found.severity == Severity.warning and found.fix.overrides() == [
        "trainer.learning_rate=1e-06"
    ]
    assert _check(["model=mymodel", "model.finetune=full", *found.fix.overrides()], where) == []
    assert (
        _check(["model=mymodel", "model.finetune=full", "trainer.learning_rate=2e-5"], where) == []
    )
    assert _check(["model=pretrained", "model.name=/m", "model.finetune=full"]) == []


def test_an_owner_less_hub_id_in_the_cache_is_a_model_not_a_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """gpt2, distilgpt2: old hub ids without an owner, told from a label by the cache."""
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    assert _check(["model.name=gpt2"]) == []  # not cached: may be a label
    (tmp_path / "hub" / "models--gpt2" / "snapshots" / "abc").mkdir(parents=True)
    problem = problem_about(_check(["model.name=gpt2"]), "model.name")
    assert problem.is_error and problem.fix.overrides() == ["model=pretrained", "model.name=gpt2"]
