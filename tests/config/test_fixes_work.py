"""Fixes that work: for every kind of problem the checks can report, the report's first
fix, applied literally, gives a configuration that composes and passes the pre-flight.

The corpus holds one failing override set per check (composition, bounds, each rule of
:mod:`art_hydra.config.validators`, the world pre-flight's task, model, backend and run
folder checks). For each, the first error (or, for a warning case, the warning) is taken
from the report exactly as the CLI builds it (:func:`compose_and_check` then
:func:`add_world_problems`), its first :class:`~art_hydra.config.problems.Fix` is
applied as command-line overrides, and the result is checked again: that problem must
be gone and no error may appear. A fix that holds a placeholder (a path only the user
knows) is not applied; it must be marked as one (a ``Placeholder`` value, rendered
``<...>`` with "replace <...>"). A fix that is an instruction rather than overrides (edit
the data file, launch differently) is allowed only where the corpus says why.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra.types import RunMode
from omegaconf import DictConfig

from art_hydra.config.composition import compose_and_check, make_loader, open_mapping_adds
from art_hydra.config.fix_chain import applied, follow, repeats, settled
from art_hydra.config.problems import Fix, Placeholder, Problem, override_value
from art_hydra.preflight import add_world_problems, cuda_present


@dataclass(frozen=True)
class Case:
    #: Overrides that produce the problem ({tmp}: the test's folder).
    overrides: tuple[str, ...]
    #: The key the problem names.
    key: str
    #: Files the case needs, made in the test's folder.
    files: Callable[[Path], None] | None = None
    #: Environment variables the case sets.
    env: dict[str, str] = field(default_factory=dict)
    #: The problem is a warning (the run works): its fix must remove it all the same.
    warning: bool = False
    #: Why the first fix is an instruction, not overrides (None: it must be overrides).
    instruction: str | None = None


def _rows(tmp: Path, rows: list[str], name: str = "data.jsonl") -> None:
    (tmp / name).write_text("".join(row + "\n" for row in rows))


def _long_prompts(tmp: Path) -> None:
    _rows(tmp, [f'{{"prompt": "{"a" * 60}", "answer": "b"}}'] * 4)


def _good_data(tmp: Path) -> None:
    _rows(tmp, ['{"prompt": "ab", "answer": "ba"}'] * 4)


def _bad_lines(tmp: Path) -> None:
    _rows(tmp, ['{"prompt": "ab", "answer": "ba"}', "{not json", '{"answer": "x"}'])


def _one_prompt(tmp: Path) -> None:
    _rows(tmp, ['{"prompt": "ab", "answer": "ba"}'])


def _short_model(tmp: Path) -> None:
    """A Mistral folder of 64 positions (char tokenizer) and data of distinct prompts."""
    from model_folders import char_tokenizer, random_model

    random_model(
        tmp / "model", "mistral", char_tokenizer(tmp / "model"), max_position_embeddings=64
    )
    _rows(tmp, [f'{{"prompt": "ab{i}=", "answer": "ba"}}' for i in range(4)])


def _empty(tmp: Path) -> None:
    (tmp / "data.jsonl").write_text("")


def _a_file_as_run_dir(tmp: Path) -> None:
    (tmp / "afile").write_text("not a folder")


def _stray_run_dir(tmp: Path) -> None:
    (tmp / "run").mkdir()
    (tmp / "run" / "pyproject.toml").write_text("[project]\nname = 'mine'\n")  # a project


def _llama_header(tmp: Path, dtype: str = "float32") -> None:
    """A model folder whose weights' header names a Llama's layers (written without
    torch: the pre-flight reads only the header and config.json)."""
    import json
    import struct

    from conftest import write_model_files

    vocab = 103  # write_model_files' tokenizer: 3 specials and string.printable
    config = {"model_type": "llama", "vocab_size": vocab, "hidden_size": 8, "dtype": dtype}
    config |= {"num_hidden_layers": 1, "max_position_embeddings": 128}
    folder = write_model_files(tmp / "llama", config)
    size = 2 if dtype == "float16" else 4
    kind = "F16" if dtype == "float16" else "F32"
    shapes = {"model.embed_tokens.weight": [vocab, 8], "lm_head.weight": [vocab, 8]}
    shapes |= {f"model.layers.0.self_attn.{n}.weight": [8, 8] for n in ("q_proj", "v_proj")}
    header, offset = {}, 0
    for name, shape in shapes.items():
        end = offset + shape[0] * shape[1] * size
        header[name] = {"dtype": kind, "shape": shape, "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + bytes(offset))


def _half_llama_header(tmp: Path) -> None:
    _llama_header(tmp, "float16")


LLAMA = (
    "model=pretrained",
    "model.name={tmp}/llama",
    "model.max_seq_length=64",
    "rl.max_prompt_length=32",
    "rl.max_completion_length=16",
    "model.lora.modules_to_save=[]",
)

JSONL = ("task=jsonl", "task.path={tmp}/data.jsonl")
FITS = ("rl.max_prompt_length=16", "rl.max_completion_length=16")

CASES: dict[str, Case] = {
    # ---- composition: overrides, types, keys, groups, mandatory values, interpolations
    "type": Case(("trainer.learning_rate=abc",), "trainer.learning_rate"),
    "plus_on_a_set_key": Case(("+trainer.learning_rate=0.1",), "trainer.learning_rate"),
    "misspelt_key": Case(("+trainer.lerning_rate=1e-5",), "trainer.lerning_rate"),
    "unknown_group_option": Case(("algorithm=foo",), "algorithm"),
    "plus_on_a_chosen_group": Case(("+backend=torch",), "+backend"),
    "enum_value": Case(("backend.device=gpu",), "backend.device"),
    "missing": Case(("model.name=???",), "model.name"),
    "empty": Case(("model.name=",), "model.name"),
    "interpolation": Case(("model.name=${oc.env:ART_HYDRA_UNSET_VARIABLE}/x",), "model.name"),
    "reward_missing": Case(("task.reward._target_=???",), "task.reward._target_"),
    "sweep_in_a_run": Case(
        ("trainer.max_steps=1,2",),
        "trainer.max_steps",
        instruction="the fix is how to launch a sweep (-m), not a value",
    ),
    "deleted_section": Case(("~trainer",), "trainer"),
    # ---- bounds declared on the schema
    "bound_low": Case(("rl.num_generations=1",), "rl.num_generations"),
    "bound_negative": Case(("trainer.learning_rate=-1",), "trainer.learning_rate"),
    "bound_range": Case(("rl.top_p=0",), "rl.top_p"),
    # ---- the rules of config/validators.py
    "accumulation": Case(
        ("trainer.gradient_accumulation_steps=2",), "trainer.gradient_accumulation_steps"
    ),
    "groups": Case(
        ("trainer.per_device_train_batch_size=100",), "trainer.per_device_train_batch_size"
    ),
    # The tiny model's positions follow its budgets: a length set by hand is what binds.
    "rl_lengths": Case(
        ("model.max_seq_length=64", "rl.max_prompt_length=60"), "rl.max_completion_length"
    ),
    "jsonl_budgets_over_the_tiny_length": Case(
        ("task=jsonl", "task.path={tmp}/data.jsonl", "model.max_seq_length=64"),
        "rl.max_completion_length",
        _good_data,
    ),
    "sft_length": Case(
        ("algorithm=sft", "model.max_seq_length=64", "sft.max_length=100"), "sft.max_length"
    ),
    "four_bit": Case(("model.load_in_4bit=true",), "model.load_in_4bit"),
    "tiny_heads": Case(("model.tiny.num_heads=3",), "model.tiny.num_heads"),
    "reward_short_name": Case(("task.reward._target_=exact_match",), "task.reward._target_"),
    "reward_stdlib": Case(("task.reward._target_=os.system",), "task.reward._target_"),
    "generator_stdlib": Case(("task.generator=os.system",), "task.generator"),
    "allowed_stdlib": Case(("task.allowed_modules=[os]",), "task.allowed_modules"),
    "greedy": Case(("rl.top_k=1",), "rl.top_k"),
    "cispo": Case(("rl.loss_type=cispo", "rl.epsilon_high=null"), "rl.epsilon_high"),
    "objective": Case(("objective.metric=accuracy",), "objective.metric"),
    "checkpoint_dir": Case(("checkpoint.dir=/tmp/elsewhere",), "checkpoint.dir"),
    "lora_both_ways": Case(
        ("model.finetune=lora", "model.lora.target_modules=[q_proj,lm_head]"),
        "model.lora.target_modules",
    ),
    "lora_all_both_ways": Case(
        ("model.finetune=lora", "model.lora.target_modules=[lm_head]"),
        "model.lora.modules_to_save",
    ),
    "low_top_p": Case(("rl.top_p=0.3",), "rl.top_p", warning=True),
    "long_warmup": Case(("trainer.warmup_steps=400",), "trainer.warmup_steps", warning=True),
    "logging_longer_than_run": Case(
        ("logging.every_steps=1000",), "logging.every_steps", warning=True
    ),
    # ---- the world pre-flight: data, lengths, code, model files, backend, run folder
    "data_missing": Case((*JSONL, *FITS), "task.path"),
    "data_path_absent": Case(("task=jsonl", *FITS), "task.path"),
    "data_empty": Case((*JSONL, *FITS), "task.path", _empty),
    "data_bad_lines": Case(
        (*JSONL, *FITS),
        "task.path",
        _bad_lines,
        instruction="the data file itself must change (its lines are listed)",
    ),
    "prompt_budget": Case((*JSONL, *FITS), "rl.max_prompt_length", _long_prompts),
    "sft_example_budget": Case(
        (*JSONL, "algorithm=sft", "sft.max_length=32"), "sft.max_length", _long_prompts
    ),
    "model_folder_absent": Case(
        ("model.source=pretrained", "model.name={tmp}/no_model"), "model.name"
    ),
    "lora_target_not_in_the_header": Case(
        (*LLAMA, "model.lora.target_modules=[q_proj,qkv]"),
        "model.lora.target_modules",
        _llama_header,
    ),
    "float16_folder_without_masters": Case(
        (*LLAMA, "model.finetune=full", "model.master_weights=false"),
        "model.master_weights",
        _half_llama_header,
    ),
    "float32_folder_without_masters": Case(
        (*LLAMA, "model.finetune=full", "model.master_weights=false"),
        "model.master_weights",
        _llama_header,
        warning=True,
    ),
    "revision_of_a_local_folder": Case(
        (*LLAMA, "model.lora.target_modules=[q_proj,v_proj]", "model.revision=v1"),
        "model.revision",
        _llama_header,
        warning=True,
    ),
    "unsloth_absent": Case(("backend=unsloth",), "backend"),
    "tracker_misspelt": Case(("logging.report_to=[tensorboard,mlfow]",), "logging.report_to"),
    "tracker_as_one_name": Case(("logging.report_to=mlflow",), "logging.report_to"),
    "tracker_none_with_others": Case(("logging.report_to=[none,trackio]",), "logging.report_to"),
    "tracker_twice": Case(
        ("logging.report_to=[trackio,trackio]",), "logging.report_to", warning=True
    ),
    "tensorboard_against_report_to": Case(
        ("logging.report_to=[trackio]", "logging.tensorboard=true"),
        "logging.tensorboard",
        warning=True,
    ),
    "wandb_online_without_a_key": Case(
        ("logging.report_to=[tensorboard,wandb]",),
        "logging.report_to",
        env={"WANDB_MODE": "online", "WANDB_API_KEY": "", "NETRC": "/nonexistent/netrc"},
    ),
    "generator_argument_unknown": Case(("+task.params.foo=4",), "task.generator"),
    "generator_argument_taken": Case(("+task.params.rng=4",), "task.params.rng"),
    "run_dir_is_a_file": Case(("hydra.run.dir={tmp}/afile",), "hydra.run.dir", _a_file_as_run_dir),
    "run_dir_impossible": Case(("hydra.run.dir=/proc/art_hydra_run",), "hydra.run.dir"),
    "run_dir_not_a_run_folder": Case(("hydra.run.dir={tmp}/run",), "hydra.run.dir", _stray_run_dir),
    "resume_nothing": Case(("resume=true",), "resume"),
    "section_set_to_null": Case(("model.lora=null",), "model.lora"),
    # A list of reward entries written or edited wrongly: the fix writes the list out.
    "rewards_as_strings": Case(
        ("task.rewards=[art_hydra.tasks.rewards.exact_match]",), "task.rewards.0"
    ),
    # An entry's other keys are a reward class's arguments: the pre-flight, which sees a
    # function here, names the one misspelt.
    "rewards_misspelt_field": Case(
        ("task.rewards=[{_target_: art_hydra.tasks.rewards.exact_match, wieght: 2}]",),
        "task.rewards.0.wieght",
    ),
    "rewards_entry_absent": Case(("task.rewards.0.weight=2",), "task.rewards.0.weight"),
    "rewards_entry_without_target": Case(
        ("task.rewards=[{weight: 2}]",), "task.rewards.0._target_"
    ),
    "eval_fraction_one_prompt": Case(
        (*JSONL, *FITS, "eval.fraction=0.5"), "eval.fraction", _one_prompt
    ),
    # model=pretrained leaves model.max_seq_length to the model (64 positions here): the
    # budgets the data fills, and evaluation's completions, are held against them.
    "derived_length_completion": Case(
        ("model=pretrained", "model.name={tmp}/model", *JSONL),
        "rl.max_completion_length",
        _short_model,
    ),
    "eval_completion_past_positions": Case(
        (
            "model=pretrained",
            "model.name={tmp}/model",
            *JSONL,
            "algorithm=sft",
            "eval.fraction=0.5",
        ),
        "eval.max_completion_length",
        _short_model,
    ),
    "world_size_without_torchrun": Case(
        (),
        "distributed.world_size",
        env={"WORLD_SIZE": "2"},
        instruction="the fix is how to launch (torchrun, or no WORLD_SIZE)",
    ),
    # Settings the run would not read (config/inert.py).
    "eval_setting_without_evaluation": Case(
        ("eval.batch_size=4",), "eval.batch_size", warning=True
    ),
    "eval_temperature_without_samples": Case(
        ("eval.fraction=0.1", "eval.temperature=0.5"), "eval.temperature", warning=True
    ),
    "sft_rewards_without_evaluation": Case(
        ("algorithm=sft", "task.rewards=[{_target_: art_hydra.tasks.rewards.exact_match}]"),
        "task.rewards",
        warning=True,
    ),
    "project_without_a_tracker": Case(("logging.project=mine",), "logging.project", warning=True),
    "collective_setting_on_one_process": Case(
        ("distributed.timeout_s=60",), "distributed.timeout_s", warning=True
    ),
    "tiny_lora_with_a_frozen_head": Case(
        ("model.finetune=lora", "model.lora.modules_to_save=[]"),
        "model.lora.modules_to_save",
        warning=True,
    ),
}
#: Cases whose first fix is known to repeat its value, fixed in the module named.
KNOWN_REPEATS: dict[str, str] = {}
if not cuda_present():
    CASES["cuda_absent"] = Case(("backend.device=cuda",), "backend.device")
    CASES["nccl_on_cpu"] = Case(("distributed.backend=nccl",), "distributed.backend", warning=True)


def _checked(overrides: list[str], tmp: Path) -> tuple[list[Problem], DictConfig | None]:
    """The problems the CLI would report for ``overrides`` (composition, then the world),
    and the config it resolved."""
    if not any(o.startswith("hydra.run.dir=") for o in overrides):
        overrides = [*overrides, f"hydra.run.dir={tmp}/fresh_run"]
    overrides = settled(open_mapping_adds(overrides))
    result = compose_and_check(make_loader(), "config", overrides, RunMode.RUN)
    add_world_problems(result)
    return result.problems, result.resolved


def _report(overrides: list[str], tmp: Path) -> list[Problem]:
    return _checked(overrides, tmp)[0]


def _the_problem(problems: list[Problem], case: Case) -> Problem:
    wanted = [p for p in problems if p.key == case.key and p.is_error != case.warning]
    assert wanted, f"no {'warning' if case.warning else 'error'} on {case.key}: {problems}"
    if not case.warning:
        first_error = next(p for p in problems if p.is_error)
        assert first_error.key == case.key, f"the first error is {first_error}"
    return wanted[0]


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_first_fix_works_when_applied_literally(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _known(name)
    case = CASES[name]
    overrides = _prepared(name, tmp_path, monkeypatch)
    problem = _the_problem(_report(overrides, tmp_path), case)
    remedy = problem.fix
    assert isinstance(remedy, Fix), f"{problem.key}: a structured Fix, not {remedy!r}"
    if case.instruction is not None:
        assert not remedy.sets and remedy.note, f"{name} has overrides now: apply them"
        return
    assert remedy.sets or remedy.drops, f"{name}: the fix is an instruction ({remedy.render()})"
    if remedy.has_placeholder:
        text = remedy.render()
        assert "<" in text and "replace <...>" in text, text
        assert all(isinstance(v, Placeholder) for _, v in remedy.sets if "<" in override_value(v))
        return
    fixed = applied(overrides, remedy)
    after = _report(fixed, tmp_path)
    errors = [p for p in after if p.is_error]
    assert not errors, f"{name}: {' '.join(fixed)} still fails: {errors}"
    same = [p for p in after if p.key == problem.key and p.reason == problem.reason]
    assert not same, f"{name}: the fix {remedy.render()} left {same}"


def _prepared(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The case's overrides, its files and environment in place."""
    case = CASES[name]
    monkeypatch.chdir(tmp_path)
    for var in ("WORLD_SIZE", "RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    for var, value in case.env.items():
        monkeypatch.setenv(var, value)
    if case.files is not None:
        case.files(tmp_path)
    return [o.replace("{tmp}", str(tmp_path)) for o in case.overrides]


def _known(name: str) -> None:
    if name in KNOWN_REPEATS:
        pytest.xfail(KNOWN_REPEATS[name])


@pytest.mark.parametrize("name", sorted(CASES))
def test_no_first_fix_repeats_the_value_it_replaces(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fix that sets the problem's key to the value it already has changes nothing
    (``eval.fraction=0.5`` told ``eval.fraction=0.5``)."""
    _known(name)
    overrides = _prepared(name, tmp_path, monkeypatch)
    problems, resolved = _checked(overrides, tmp_path)
    problem = _the_problem(problems, CASES[name])
    remedy = problem.fix
    assert isinstance(remedy, Fix)
    same = [k for k, v in remedy.sets if k.lstrip("+") == problem.key and v == problem.value]
    assert not same or remedy.drops, f"{name}: {remedy.render()} repeats {problem.value!r}"
    assert not repeats(problem, resolved, overrides), f"{name}: {remedy.render()}"


@pytest.mark.parametrize("name", sorted(CASES))
def test_the_first_fix_pasted_after_the_command_line_works(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fix as the report renders it (``~key`` for what it deletes), appended to the
    command line as a user pastes it, removes the problem and leaves no error."""
    _known(name)
    case = CASES[name]
    overrides = _prepared(name, tmp_path, monkeypatch)
    problem = _the_problem(_report(overrides, tmp_path), case)
    remedy = problem.fix
    assert isinstance(remedy, Fix)
    if case.instruction is not None or remedy.has_placeholder:
        return
    pasted = [*overrides, *remedy.overrides(), *remedy.deletions()]
    if any(d.startswith("~") for d in remedy.drops):  # said in words: leave it out
        pasted = applied(pasted, Fix(drops=remedy.drops))
    after = _report(pasted, tmp_path)
    errors = [p for p in after if p.is_error]
    assert not errors, f"{name}: {' '.join(pasted)} still fails: {errors}"
    assert not [p for p in after if p.key == problem.key and p.reason == problem.reason]


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_fix_of_the_report_holds_in_the_chain(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every error's fix applied together (as the refusal's report does to find what
    they reveal): no fix leaves its own problem, none repeats the value it replaces."""
    _known(name)
    overrides = _prepared(name, tmp_path, monkeypatch)
    problems, resolved = _checked(overrides, tmp_path)
    chain = follow(problems, resolved, overrides, lambda fixed: _checked(fixed, tmp_path))
    assert not chain.stuck, f"{name}: these fixes do not hold: {chain.stuck}"
    assert not chain.repeated, f"{name}: these fixes repeat the value: {chain.repeated}"


def test_every_fix_value_that_looks_like_a_placeholder_is_marked(tmp_path: Path) -> None:
    """No fix of the corpus offers ``<...>`` or ``/path/to`` as if it were a real value."""
    fake = ("<", "/path/to", "/absolute/path")
    for name, case in CASES.items():
        if case.env or case.files:
            continue
        overrides = [o.replace("{tmp}", str(tmp_path)) for o in case.overrides]
        for problem in _report(overrides, tmp_path):
            remedy = problem.fix
            while isinstance(remedy, Fix):
                for _, value in remedy.sets:
                    if any(f in str(value) for f in fake):
                        assert isinstance(value, Placeholder), f"{name}: {problem}"
                remedy = remedy.alt
