"""The editor schema (``art-hydra --schema``): it accepts every shipped config file and
the composed default, rejects a wrong type, an unknown key and an out-of-bound value,
names every group option of conf/, and the copy shipped in the wheel never goes stale.

Checked with a real validator (``jsonschema``, draft 2020-12) on the real files.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import output_of
from jsonschema import Draft202012Validator
from omegaconf import OmegaConf

from art_hydra import compose
from art_hydra.config import json_schema
from art_hydra.config.bounds import type_hints
from art_hydra.config.schema import RunConfig

CONF = Path(__file__).resolve().parents[2] / "conf"
SHIPPED_FILES = sorted(CONF.rglob("*.yaml"))


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    built = json_schema.build()
    Draft202012Validator.check_schema(built)
    return built


@pytest.fixture(scope="module")
def validator(schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator(schema)


def _as_written(path: Path) -> Any:
    """A config file as an editor sees it: YAML, interpolations unresolved (read by
    OmegaConf, which reads ``5e-6`` as a number as YAML 1.2 editors do)."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def _errors(validator: Draft202012Validator, doc: Any) -> list[str]:
    return [error.message for error in validator.iter_errors(doc)]


@pytest.mark.parametrize(
    "path", SHIPPED_FILES, ids=[p.relative_to(CONF).as_posix() for p in SHIPPED_FILES]
)
def test_every_shipped_config_file_is_accepted(validator: Draft202012Validator, path: Path) -> None:
    assert _errors(validator, _as_written(path)) == []


def test_the_composed_default_is_accepted(validator: Draft202012Validator) -> None:
    composed = OmegaConf.to_container(compose([]), resolve=True, enum_to_str=True)
    assert isinstance(composed, dict) and "hydra" not in composed
    assert _errors(validator, composed) == []


@pytest.mark.parametrize(
    "doc",
    [
        {"trainer": {"learning_rate": "abc"}},  # a wrong type
        {"trainer": {"lerning_rate": 1e-5}},  # an unknown key
        {"trainr": {"learning_rate": 1e-5}},  # an unknown section
        {"rl": {"num_generations": 1}},  # below its bound (a group of one has no advantage)
        {"trainer": {"learning_rate": 0}},  # an exclusive bound
        {"rl": {"top_p": 1.5}},  # above its bound
        {"backend": {"device": "tpu"}},  # not a choice of the enum
        {"logging": {"progress_bar": "sometimes"}},  # not a choice of the string
        {"model": {"lora": {"target_modules": []}}},  # must not be empty
        {"name": "sft", "nme": 1},  # a section file with a misspelt key
        {"defaults": [{"override /model": "no_such_model"}]},  # not an option of the group
        {"defaults": [{"no_such_group": "x"}]},  # not a group
    ],
    ids=lambda doc: json.dumps(doc),
)
def test_a_mistake_is_rejected(validator: Draft202012Validator, doc: dict[str, Any]) -> None:
    assert _errors(validator, doc)


@pytest.mark.parametrize(
    "doc",
    [
        {"trainer": {"learning_rate": "${oc.env:LR}"}},  # an interpolation for a number
        {"model": {"name": "???"}},  # a mandatory value left open
        {"rl": {"epsilon_high": None}},  # an optional value
        {"logging": {"progress_bar": False}},  # YAML 1.1 reads a bare `off` as false
        # A section's bounds hold only where it is used: LoRA settings are unused when
        # the same file trains every weight, as art_hydra itself accepts.
        {"model": {"finetune": "full", "lora": {"r": 0}}},
        {"algorithm": {"name": "sft"}, "rl": {"num_generations": 1}},
        {"defaults": ["_self_", {"override /model": "tiny"}, {"experiment": None}]},
        {"name": "jsonl", "source": "jsonl"},  # the task section, as conf/task/jsonl.yaml
    ],
    ids=lambda doc: json.dumps(doc),
)
def test_hydra_syntax_and_unused_sections_are_accepted(
    validator: Draft202012Validator, doc: dict[str, Any]
) -> None:
    assert _errors(validator, doc) == []


def test_the_group_enums_name_every_option_of_conf(schema: dict[str, Any]) -> None:
    groups = schema["$defs"]["groups"]["const"]
    on_disk = {p.parent.relative_to(CONF).as_posix() for p in SHIPPED_FILES if p.parent != CONF}
    assert set(groups) == on_disk
    entries = schema["$defs"]["defaults"]["items"]["anyOf"][1]["properties"]
    for group in ("algorithm", "backend", "model", "task", "experiment"):
        options = sorted(p.stem for p in (CONF / group).glob("*.yaml"))
        assert groups[group] == options
        for key in (group, f"override /{group}"):
            assert entries[key]["anyOf"][0]["enum"] == [*options, None]


def _leaf_properties(cls: type) -> list[tuple[type, str]]:
    found: list[tuple[type, str]] = []
    for f in dataclasses.fields(cls):
        hint = type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            found.extend(_leaf_properties(hint))
        else:
            found.append((cls, f.name))
    return found


def test_every_field_has_its_type_default_and_description(schema: dict[str, Any]) -> None:
    for cls, name in _leaf_properties(RunConfig):
        prop = schema["$defs"][cls.__name__]["properties"][name]
        assert prop["description"], f"{cls.__name__}.{name} has no description"
        assert "anyOf" in prop, f"{cls.__name__}.{name} has no type"
    trainer = schema["$defs"]["TrainerConfig"]["properties"]
    assert trainer["learning_rate"]["default"] == 1e-5
    assert trainer["lr_scheduler_type"]["default"] == "constant"
    lora = schema["$defs"]["LoraConfig"]["properties"]
    assert "q_proj" in lora["target_modules"]["default"]  # a factory's default too


def test_the_shipped_schema_is_the_generated_one() -> None:
    """The wheel's copy equals what the code generates; regenerate it with
    ``python -m art_hydra.config.json_schema --write``."""
    assert json_schema.SHIPPED.read_text(encoding="utf-8") == json_schema.render()


def test_the_command_prints_the_shipped_schema(cli) -> None:
    proc = cli("--schema")
    assert proc.returncode == 0, output_of(proc)
    json.loads(proc.stdout)
    assert proc.stdout == json_schema.SHIPPED.read_text(encoding="utf-8")


def test_a_config_dir_adds_its_groups_and_options(cli, tmp_path: Path) -> None:
    own = tmp_path / "my_conf"
    (own / "model").mkdir(parents=True)
    (own / "model" / "mine.yaml").write_text("# @package _global_\nmodel:\n  name: mine\n")
    (own / "reward_set").mkdir()
    (own / "reward_set" / "strict.yaml").write_text("{}\n")
    proc = cli("--schema", "--config-dir", str(own))
    assert proc.returncode == 0, output_of(proc)
    extended = Draft202012Validator(json.loads(proc.stdout))
    picks = {"defaults": [{"override /model": "mine"}, {"reward_set": "strict"}]}
    assert _errors(extended, picks) == []
    assert _errors(extended, _as_written(own / "model" / "mine.yaml")) == []
    assert _errors(Draft202012Validator(json_schema.build()), picks)


def test_the_command_imports_nothing_heavy() -> None:
    code = (
        "import sys, io, contextlib\n"
        "sys.argv = ['art-hydra', '--schema']\n"
        "from art_hydra import cli\n"
        "try:\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        cli.main()\n"
        "except SystemExit as exc:\n"
        "    assert exc.code == 0, exc.code\n"
        "heavy = [m for m in ('torch', 'transformers', 'peft', 'unsloth') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
