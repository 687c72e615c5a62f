"""Every shipped config, group option and experiment composes and validates; the schema
and YAML files are documented and hold no duplicated defaults."""

from __future__ import annotations

import importlib.resources
from pathlib import Path
from typing import Any

import pytest
from omegaconf import DictConfig, OmegaConf

import art_hydra.config.schema as schema
from art_hydra import compose

CONF = Path(__file__).resolve().parents[2] / "conf"
GROUPS = ["algorithm", "backend", "model", "task", "experiment"]

# Settings some options need to be complete (the pretrained option needs a model; the
# jsonl task needs a file, and the tiny model's positions follow its budgets).
NEEDS: dict[tuple[str, str], list[str]] = {
    ("model", "pretrained"): ["model.name=/models/mine"],
}


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize(
    ("group", "option"),
    [(g, o) for g in GROUPS for o in _options(g)],
    ids=[f"{g}={o}" for g in GROUPS for o in _options(g)],
)
def test_option_composes_and_validates(group: str, option: str, tmp_path: Path) -> None:
    extra = list(NEEDS.get((group, option), []))
    if (group, option) == ("task", "dataset"):
        extra.append("task.path=owner/name")
    if (group, option) == ("task", "jsonl"):
        data = tmp_path / "data.jsonl"
        data.write_text('{"prompt": "hi", "answer": "there"}\n')
        extra.append(f"task.path={data}")
    cfg = compose([f"{group}={option}", *extra])
    assert isinstance(cfg, DictConfig)
    assert OmegaConf.get_type(cfg) is schema.RunConfig
    assert OmegaConf.to_yaml(cfg, resolve=True)  # every interpolation resolves


def test_each_group_has_what_the_issue_asks_for() -> None:
    assert set(_options("algorithm")) == {"rl", "sft"}
    assert set(_options("backend")) == {"torch", "unsloth"}
    assert "tiny" in _options("model") and len(_options("model")) >= 3
    assert "jsonl" in _options("task") and len(_options("task")) >= 3
    assert len(_options("experiment")) >= 1


def test_defaults_are_rl_tiny_torch() -> None:
    cfg = compose()
    assert cfg.algorithm.name == schema.AlgorithmName.rl
    assert cfg.model.source == schema.ModelSource.tiny
    assert cfg.backend.name == "torch"


PUBLIC_KEYS = [
    "trainer.learning_rate",
    "trainer.gradient_accumulation_steps",
    "trainer.per_device_train_batch_size",
    "trainer.max_steps",
    "trainer.max_grad_norm",
    "trainer.weight_decay",
    "trainer.warmup_steps",
    "trainer.lr_scheduler_type",
    "rl.num_generations",
    "rl.epsilon",
    "rl.epsilon_high",
    "rl.beta",
    "rl.temperature",
    "rl.max_completion_length",
    "model.name",
    "model.max_seq_length",
    "model.lora.r",
    "model.lora.alpha",
    "seed",
    "dry_run",
    "resume",
]


@pytest.mark.parametrize("key", PUBLIC_KEYS)
def test_public_key_paths_exist(key: str) -> None:
    cfg = OmegaConf.structured(schema.RunConfig)
    parent, _, leaf = key.rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    assert leaf in node.keys()  # noqa: SIM118 (`in` is False for a ??? value)


def _yaml_files() -> list[Path]:
    return sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", _yaml_files(), ids=lambda p: str(p.relative_to(CONF)))
def test_every_yaml_value_has_a_comment_above(path: Path) -> None:
    lines = path.read_text().splitlines()
    block: int | None = None  # the indentation of a block scalar's key (``key: |``)
    for i, line in enumerate(lines):
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        if block is not None and (not stripped or indent > block):
            continue  # text of a block scalar, not a key
        block = None
        if not stripped or stripped.startswith(("#", "- ")) or ":" not in stripped:
            continue
        value = stripped.partition(":")[2]
        if value.strip() in ("|", "|-", ">", ">-"):
            block = indent
        if not value.strip():  # a section header; its children carry the comments
            continue
        above = lines[i - 1].strip() if i else ""
        assert above.startswith("#"), f"{path.name}:{i + 1}: '{stripped}' has no comment above"


def _package_of(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    if first.startswith("# @package"):
        package = first.split()[-1]
        return "" if package == "_global_" else package
    return str(path.parent.relative_to(CONF)).replace("/", ".")


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, dict):
        out = []
        for k, v in node.items():
            if k == "defaults":
                continue
            out += _leaves(v, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}")
        return out if out or not isinstance(node, dict) else []
    return [(prefix, node)]


@pytest.mark.parametrize(
    "path",
    [p for p in _yaml_files() if p.name != "config.yaml" and "hydra" not in p.parts],
    ids=lambda p: str(p.relative_to(CONF)),
)
def test_no_yaml_restates_a_schema_default(path: Path) -> None:
    defaults = OmegaConf.structured(schema.RunConfig)
    raw = OmegaConf.to_container(OmegaConf.load(path)) or {}
    package = _package_of(path)
    for key, value in _leaves(raw, f"{package}." if package else ""):
        default = OmegaConf.select(defaults, key, throw_on_missing=False)
        default = getattr(default, "name", default)  # enums compare by their YAML spelling
        assert value != default, f"{path.name}: {key}={value!r} restates the schema default"


def test_conf_ships_inside_the_package() -> None:
    files = importlib.resources.files("art_hydra.conf")
    assert files.joinpath("config.yaml").is_file()
    assert files.joinpath("model").joinpath("tiny.yaml").is_file()
