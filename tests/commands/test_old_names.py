"""Names users and old runs hold still work after the package got its rooms (issue 33):
the flat layout's module names, the plugin entry-point groups, the console script's
target and the dotted names shipped configs record."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from conftest import ART_HYDRA

from art_hydra import moved

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("old", sorted(moved.OLD_NAMES))
def test_an_old_module_name_is_the_new_module_itself(old: str) -> None:
    """One object under both names: a loss registered through ``art_hydra.rl.losses`` is
    in the registry ``art_hydra.engine.rl.losses`` fills."""
    new = importlib.import_module(moved.OLD_NAMES[old])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sys.modules.pop(old, None)
        assert importlib.import_module(old) is new
    assert any(moved.OLD_NAMES[old] in str(w.message) for w in caught)


def test_a_submodule_of_an_old_package_follows_it() -> None:
    """``from art_hydra.rl.losses import register_policy_loss`` as the README once showed,
    in a fresh interpreter: no second copy of the module is made."""
    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('error')\n"
        "try:\n"
        "    from art_hydra.rl.losses import register_policy_loss\n"
        "except DeprecationWarning as w:\n"
        "    print('WARNED', w)\n"
        "warnings.simplefilter('ignore')\n"
        "from art_hydra.rl.losses import register_policy_loss\n"
        "from art_hydra.backends.tiny import build_tokenizer\n"
        "import art_hydra.engine.rl.losses as new\n"
        "import art_hydra.engine.backends.tiny as tiny\n"
        "print(register_policy_loss is new.register_policy_loss, build_tokenizer is "
        "tiny.build_tokenizer)\n"
        "files = {}\n"
        "for m in list(sys.modules.values()):\n"
        "    files.setdefault(getattr(m, '__file__', None), set()).add(id(m))\n"
        "print('COPIES', [f for f, ids in files.items() if f and len(ids) > 1])\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "WARNED art_hydra.rl is now art_hydra.engine.rl" in out
    assert "True True" in out
    assert "COPIES []" in out, out  # an old name is the module, never a second copy


def test_the_console_script_and_its_old_target_both_start_the_command() -> None:
    text = (ROOT / "pyproject.toml").read_text()
    assert 'art-hydra = "art_hydra.commands.cli:main"' in text
    for target in ("art_hydra.commands.cli", "art_hydra.cli"):
        out = subprocess.run(
            [sys.executable, "-W", "ignore", "-c", f"from {target} import main; main()", "--help"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr
        assert "trainer.gradient_accumulation_steps" in out.stdout


def test_the_plugin_entry_point_groups_keep_their_published_names() -> None:
    """Installed plugins declare these groups in their metadata; renaming one would drop
    every plugin silently."""
    from art_hydra.config import advantage_estimators, backends, policy_losses, validator_registry
    from art_hydra.preflight import world_check_registry

    groups = {
        module.ENTRY_POINT_GROUP
        for module in (
            validator_registry,
            world_check_registry,
            policy_losses,
            backends,
            advantage_estimators,
        )
    }
    assert groups == {
        "art_hydra.validators",
        "art_hydra.world_checks",
        "art_hydra.policy_losses",
        "art_hydra.backends",
        "art_hydra.advantage_estimators",
    }


def test_the_dotted_names_configs_record_never_moved() -> None:
    """Shipped configs and old runs' run_config.yaml name rewards and generators by dotted
    path; none of them lies under a moved name."""
    recorded = {
        line.split(":", 1)[1].strip().strip("'\"")
        for path in (ROOT / "conf").rglob("*.yaml")
        for line in path.read_text().splitlines()
        if "art_hydra." in line and ":" in line and not line.lstrip().startswith("#")
    }
    names = {n for n in recorded if n.startswith("art_hydra.tasks.")}
    assert names, "the shipped configs name art_hydra's rewards and generators"
    for name in names:
        assert moved.new_name(name) is None
        module, _, attr = name.rpartition(".")
        assert hasattr(importlib.import_module(module), attr), name


def test_an_old_name_leaves_the_module_its_own_spec() -> None:
    """Importing through the old name must not relabel the module: a package keeps its
    submodule locations (importlib.resources reads them) and reload finds its file."""
    code = (
        "import importlib, importlib.resources, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "import art_hydra.backends.tiny, art_hydra.rl\n"
        "import art_hydra.engine.backends as b, art_hydra.engine.backends.tiny as t\n"
        "print(b.__spec__.name, t.__spec__.name)\n"
        "print(importlib.resources.files('art_hydra.engine.backends').is_dir())\n"
        "print(importlib.reload(t) is t)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split("\n")
    assert out[0] == "art_hydra.engine.backends art_hydra.engine.backends.tiny"
    assert out[1:3] == ["True", "True"]


def test_python_dash_m_runs_an_old_module_name() -> None:
    out = subprocess.run(
        [sys.executable, "-W", "ignore", "-m", "art_hydra.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert "trainer.gradient_accumulation_steps" in out.stdout


@pytest.mark.parametrize(("module", "name"), sorted(moved.OLD_ATTRIBUTES))
def test_a_name_that_left_its_module_still_answers_there(module: str, name: str) -> None:
    home, _, attr = moved.OLD_ATTRIBUTES[(module, name)].partition(":")
    with pytest.warns(DeprecationWarning, match=f"{home}.{attr}"):
        found = getattr(importlib.import_module(module), name)
    assert found is getattr(importlib.import_module(home), attr)


def test_loggers_keep_the_names_users_filter_on() -> None:
    """The console and art_hydra.log show a record's logger name; the move kept them."""
    from art_hydra.engine import cpu_load, producer
    from art_hydra.engine.backends import torch_backend
    from art_hydra.sweeps import grid, launching

    assert cpu_load.log.name == "art_hydra.cpu_load"
    assert producer.log.name == "art_hydra.producer"
    assert torch_backend.log.name == "art_hydra.backends.torch_backend"
    assert launching.log.name == "hydra_plugins.art_hydra_preflight.preflight_launcher"
    assert grid.log.name == "hydra_plugins.art_hydra_preflight.preflight_sweeper"


@pytest.mark.parametrize(
    "argv",
    [
        ["-cp", "conf", "dry_run=true"],
        ["--config-path=conf", "--cfg", "job"],
        ["-cp", "conf", "-m", "seed=1,2", "dry_run=true"],
    ],
    ids=["single", "cfg", "sweep"],
)
def test_a_relative_config_path_still_names_the_shipped_conf(
    tmp_path: Path, argv: list[str]
) -> None:
    """``-cp conf`` was read against the art_hydra package while the command lived in
    art_hydra/cli.py; the check and Hydra's own parse (sweeps, --cfg) still read it so."""
    out = subprocess.run(
        [ART_HYDRA, *argv], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "tiny-llama" in out.stdout or "#1: seed=2" in out.stdout, out.stdout
