"""The caching config loader gives exactly the config Hydra's own loader gives.

It composes once per group selection and applies value overrides to a copy; the tests
compare its output with Hydra's ``ConfigLoaderImpl`` on random override lists (groups,
values, ``+``/``~``/``++``, ``hydra.*`` keys, ``${hydra:...}`` interpolations, bad
overrides) in any order of calls, and check that a changed file is read again.
"""

from __future__ import annotations

import io
import random
from pathlib import Path

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra.types import RunMode
from omegaconf import OmegaConf

from art_hydra.config import hydra_compat
from art_hydra.config.composition import config_path, make_loader

GROUPS = [
    ["algorithm=rl", "algorithm=sft"],
    ["model=tiny", "model=qwen2_5_0_5b_instruct"],
    ["task=reverse", "task=digit_sum", "task=nope"],
    ["experiment=any"],
    ["hydra/launcher=joblib", "hydra/sweeper=basic"],
]
VALUES = [
    "trainer.learning_rate=3e-4",
    "trainer.max_steps=7",
    "rl.temperature=0.9",
    "seed=3",
    "+trainer.lerning_rate=1e-5",
    "~logging.plot",
    "++trainer.warmup_steps=2",
    "checkpoint.dir=${hydra:runtime.output_dir}/ck",
    "trainer.learning_rate=abc",
    "hydra.run.dir=/tmp/x/${now:%Y}",
    "hydra.job.chdir=true",
    "task.params={}",
]


def _hydra_loader() -> ConfigLoaderImpl:
    return ConfigLoaderImpl(config_search_path=make_loader().config_search_path)


def _outcome(loader: object, overrides: list[str], mode: RunMode) -> str:
    try:
        cfg = loader.load_configuration("config", overrides, run_mode=mode)  # type: ignore[attr-defined]
    except Exception as exc:  # the same failure, of the same type and message
        return f"{type(exc).__name__}: {exc}"
    return OmegaConf.to_yaml(cfg, resolve=False)


def _experiments() -> list[str]:
    folder = Path(config_path()) if "://" not in config_path() else None
    return sorted(p.stem for p in (folder / "experiment").glob("*.yaml")) if folder else []


def test_random_override_lists_compose_exactly_as_hydra_composes_them() -> None:
    rng = random.Random(17)
    ours = hydra_compat.make_loader(config_path())
    theirs = _hydra_loader()
    experiments = _experiments() or ["tiny_sft_reverse"]
    for _ in range(15):
        picked = [rng.choice(g) for g in GROUPS if rng.random() < 0.5]
        picked = [
            f"experiment={rng.choice(experiments)}" if p.startswith("experiment") else p
            for p in picked
        ]
        picked += rng.sample(VALUES, rng.randint(0, 4))
        rng.shuffle(picked)
        mode = rng.choice([RunMode.RUN, RunMode.MULTIRUN])
        assert _outcome(ours, picked, mode) == _outcome(theirs, picked, mode), picked


def test_a_config_returned_is_the_callers_to_change() -> None:
    loader = hydra_compat.make_loader(config_path())
    first = loader.load_configuration("config", ["trainer.max_steps=3"], run_mode=RunMode.RUN)
    first.trainer.max_steps = 99
    OmegaConf.set_struct(first, False)
    first.extra = 1
    again = loader.load_configuration("config", ["seed=2"], run_mode=RunMode.RUN)
    assert again.trainer.max_steps != 99 and "extra" not in again
    assert list(again.hydra.overrides.task) == ["seed=2"]


@pytest.mark.parametrize("change", ["edit", "add option"])
def test_a_changed_config_file_is_read_again(tmp_path: Path, change: str) -> None:
    (tmp_path / "experiment").mkdir()
    mine = tmp_path / "experiment" / "mine.yaml"
    mine.write_text("# @package _global_\ntrainer:\n  max_steps: 5\n")
    loader = hydra_compat.make_loader(config_path(), str(tmp_path))
    cfg = loader.load_configuration("config", ["experiment=mine"], run_mode=RunMode.RUN)
    assert cfg.trainer.max_steps == 5
    if change == "edit":
        mine.write_text("# @package _global_\ntrainer:\n  max_steps: 66\n")
        cfg = loader.load_configuration("config", ["experiment=mine"], run_mode=RunMode.RUN)
        assert cfg.trainer.max_steps == 66
    else:
        (tmp_path / "task").mkdir()
        (tmp_path / "task" / "mine.yaml").write_text("defaults:\n  - reverse\nnum_examples: 9\n")
        cfg = loader.load_configuration(
            "config", ["experiment=mine", "task=mine"], run_mode=RunMode.RUN
        )
        assert cfg.task.num_examples == 9


def test_a_selection_is_composed_once_from_its_first_composition_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused single run's fixes compose with its own group selection: the second
    composition copies the first's, as Hydra would have composed it."""
    from hydra._internal import defaults_list

    calls = []
    original = defaults_list.create_defaults_list

    def counted(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(defaults_list, "create_defaults_list", counted)
    ours = hydra_compat.caching_loader(make_loader().config_search_path)
    theirs = _hydra_loader()
    for overrides in (["trainer.gradient_accumulation_steps=2"], ["seed=4", "rl.temperature=0.5"]):
        assert _outcome(ours, overrides, RunMode.RUN) == _outcome(theirs, overrides, RunMode.RUN)
    assert len(calls) == 1  # ours: once for both (Hydra's own loader composes each)


def test_libyaml_reads_every_shipped_config_file_as_omegaconf_does() -> None:
    folder = hydra_compat._shipped_folder()
    assert folder is not None
    for path in sorted(Path(folder).rglob("*.yaml")):
        assert hydra_compat._shipped(str(path)), path
        text = path.read_text()
        ours = hydra_compat._shipped_load(text)
        assert OmegaConf.to_yaml(ours) == OmegaConf.to_yaml(OmegaConf.load(path)), path
    assert not hydra_compat._shipped("/elsewhere/conf/config.yaml")


@pytest.mark.parametrize(
    "text", ["a: 1\na: 2\n", "a: [1\n", "x: 1e3\ny: 2020-01-01\n", "plain", "a: !!python/none\n"]
)
def test_a_shipped_files_reader_fails_and_reads_as_omegaconfs(text: str) -> None:
    def outcome(load: object) -> str:
        try:
            return OmegaConf.to_yaml(load(text))  # type: ignore[operator]
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"

    assert outcome(hydra_compat._shipped_load) == outcome(lambda t: OmegaConf.load(io.StringIO(t)))


def test_an_interpolation_parsed_once_resolves_and_fails_as_before() -> None:
    from omegaconf.errors import GrammarParseError

    hydra_compat.parse_interpolations_once()
    for _ in range(2):
        cfg = OmegaConf.create({"a": 2, "b": "${a}", "c": "x-${b}-${oc.env:NO_SUCH_VAR_39,d}"})
        assert (cfg.b, cfg.c) == (2, "x-2-d")
        cfg.a = 5
        assert cfg.c == "x-5-d"
        with pytest.raises(GrammarParseError):
            OmegaConf.create({"bad": "${a"})
