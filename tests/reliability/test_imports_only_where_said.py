"""Code is imported only from where the user said (issue 32).

The folder a user runs ``art-hydra`` in is usually a data folder, and its files are data:
a ``*.dist-info`` lying there (hidden or not) adds no plugin, a ``hydra_plugins/`` there
joins no plugin scan, and a ``yaml.py`` or ``numpy.py`` there never replaces the library.
Each such payload would create a marker file when imported; every test asserts that no
marker exists. A module the command line names (``task.reward._target_=my_rewards.f``)
still loads from that folder, and the dry run's account of code outside art_hydra is
read from what the process really imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import output_of, run_cli
from plugin_packages import install_package

pytestmark = pytest.mark.fast

#: The art_hydra plugin groups a ``*.dist-info`` could name.
GROUPS = (
    "art_hydra.validators",
    "art_hydra.world_checks",
    "art_hydra.policy_losses",
    "art_hydra.backends",
    "art_hydra.advantage_estimators",
)
#: Installed libraries the command imports (or may), shadowed by a file of the folder.
SHADOWS = ("yaml", "omegaconf", "numpy", "datasets", "jinja2", "markupsafe", "antlr4")
NO_OUTSIDE_CODE = "No code outside art_hydra runs"


def _payload(folder: Path, name: str) -> str:
    """Source that leaves ``pwned-<name>`` in ``folder`` when it runs."""
    return f"open({str(folder / f'pwned-{name}')!r}, 'w').close()\n"


def _markers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("pwned-*"))


def _dist_info(folder: Path, dirname: str, module: str) -> None:
    info = folder / dirname
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {module}\nVersion: 1.0\n")
    entries = "".join(f"[{group}]\n{module} = {module}\n" for group in GROUPS)
    (info / "entry_points.txt").write_text(entries)
    (folder / f"{module}.py").write_text(_payload(folder, module))


def _hostile_folder(folder: Path) -> Path:
    """A data folder with every payload of the class: dist-info (hidden and not),
    Hydra plugins (a package and a module), and modules that shadow libraries."""
    _dist_info(folder, ".evil-1.0.dist-info", "evil")
    _dist_info(folder, "other-2.0.dist-info", "other")
    plugins = folder / "hydra_plugins"
    (plugins / "folder_plugin").mkdir(parents=True)
    (plugins / "folder_plugin" / "__init__.py").write_text(_payload(folder, "hydra_plugin"))
    (plugins / "folder_sweeper.py").write_text(_payload(folder, "hydra_module"))
    for name in SHADOWS:
        (folder / f"{name}.py").write_text(_payload(folder, name))
    (folder / "data.jsonl").write_text('{"prompt": "ab=", "answer": "ba"}\n')
    return folder


#: How the command is started: its argv prefix and its environment.
LAUNCHES = {
    "console_script": ([], {}),
    "python_dash_m": (["-m"], {}),
    "folder_on_pythonpath": ([], {"PYTHONPATH": "."}),
}


def _run(folder: Path, launch: str, *args: str) -> subprocess.CompletedProcess:
    prefix, env = LAUNCHES[launch]
    return run_cli(*args, cwd=folder, env=env, module=bool(prefix))


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_a_data_folder_runs_no_code_when_the_command_starts_there(
    tmp_path: Path, launch: str
) -> None:
    folder = _hostile_folder(tmp_path)
    data = ["task=jsonl", f"task.path={folder / 'data.jsonl'}", "rl.max_prompt_length=32"]
    dry = _run(folder, launch, *data, "dry_run=true")
    assert dry.returncode == 0, output_of(dry)
    assert NO_OUTSIDE_CODE in dry.stdout
    refused = _run(folder, launch, *data, "trainer.learning_rate=abc")
    assert refused.returncode == 1 and "trainer.learning_rate" in output_of(refused)
    sweep = _run(folder, launch, "-m", "algorithm=rl,sft", "dry_run=true")
    assert sweep.returncode == 0, output_of(sweep)
    assert _markers(folder) == []
    assert not (folder / "outputs").exists()


def test_a_python_program_reads_no_entry_point_from_its_working_folder(tmp_path: Path) -> None:
    """``python -c`` puts the working folder on the path ('' first): the program's own
    choice for imports, but a dist-info lying there is still no install."""
    _dist_info(tmp_path, ".evil-1.0.dist-info", "evil")
    script = (
        "from art_hydra import compose, validate\n"
        "from art_hydra.preflight import world_problems\n"
        "cfg = compose(['dry_run=true'])\n"
        "validate(cfg)\n"
        "print(world_problems(cfg, None))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert _markers(tmp_path) == []


def test_an_installed_module_wins_over_a_named_file_of_the_working_folder(
    tmp_path: Path,
) -> None:
    (tmp_path / "markupsafe.py").write_text(
        _payload(tmp_path, "markupsafe") + "def score(prompt, completion, answer):\n    return 1\n"
    )
    proc = run_cli("task.reward._target_=markupsafe.score", "dry_run=true", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1 and "has no attribute 'score'" in out, out
    assert _markers(tmp_path) == []


REWARDS = """
from art_hydra import reward
from my_helpers import clean

{payload}

@reward
def marked(prompt, completion, answer):
    return float(clean(completion) == answer)

def unmarked(prompt, completion, answer):
    return 1.0
"""


def _user_folder(folder: Path) -> Path:
    (folder / "my_rewards.py").write_text(REWARDS.format(payload=_payload(folder, "my_rewards")))
    (folder / "my_helpers.py").write_text("def clean(text):\n    return text.strip()\n")
    (folder / "my_pkg").mkdir()
    (folder / "my_pkg" / "__init__.py").write_text("")
    (folder / "my_pkg" / "rewards.py").write_text(
        "def score(prompt, completion, answer):\n    return 1.0\n"
    )
    return folder


@pytest.mark.parametrize(
    ("module", "overrides", "listed"),
    [
        (False, ["task.reward._target_=my_rewards.unmarked"], "reward: my_rewards.unmarked"),
        (True, ["task.reward._target_=my_rewards.marked"], "reward: my_rewards.marked"),
        (
            False,
            ["task.rewards=[{_target_: my_rewards.marked, weight: 1.0}]"],
            "reward: my_rewards.marked",
        ),
        (
            False,
            ["task.allowed_modules=[my_pkg]", "task.reward._target_=my_pkg.rewards.score"],
            "reward: my_pkg.rewards.score",
        ),
    ],
    ids=["unmarked", "python_dash_m", "rewards_list", "allowed_package"],
)
def test_a_module_named_on_the_command_line_loads_from_the_working_folder_and_is_listed(
    tmp_path: Path, module: bool, overrides: list[str], listed: str
) -> None:
    folder = _user_folder(tmp_path)
    proc = run_cli(*overrides, "dry_run=true", cwd=folder, module=module)
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert listed in out and NO_OUTSIDE_CODE not in out
    if "my_rewards" in listed:
        # The reward module's own helper, imported by it, is listed with its file too.
        assert str(folder / "my_rewards.py") in out
        assert "my_helpers" in out and str(folder / "my_helpers.py") in out
        assert _markers(folder) == ["pwned-my_rewards"]


def test_a_module_a_config_file_names_is_not_imported_from_the_working_folder(
    tmp_path: Path,
) -> None:
    folder = _user_folder(tmp_path)
    (folder / "conf" / "experiment").mkdir(parents=True)
    (folder / "conf" / "experiment" / "shared.yaml").write_text(
        "# @package _global_\ntask:\n  reward:\n    _target_: my_rewards.marked\n"
    )
    proc = run_cli(
        "--config-dir", str(folder / "conf"), "experiment=shared", "dry_run=true", cwd=folder
    )
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "no module named 'my_rewards'" in out
    assert "imported only when the command line names it" in out
    assert _markers(folder) == []


def test_the_dry_run_lists_plugins_and_modules_from_outside_the_environment(
    tmp_path: Path,
) -> None:
    """The account is read from the process: an installed validator plugin and a module
    of a ``PYTHONPATH`` folder (Python imports its ``sitecustomize`` at start-up) are
    listed, so "no code outside art_hydra" is not said."""
    plugin = "from art_hydra import validator\n\n@validator\ndef acme_rule(cfg):\n    return []\n"
    site = install_package(
        tmp_path, "acme_rules", plugin, "art_hydra.validators", 'rule = "acme_rules"\n'
    )
    (site / "sitecustomize.py").write_text("STARTED = True\n")
    proc = run_cli("dry_run=true", cwd=tmp_path, env={"PYTHONPATH": str(site)})
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert NO_OUTSIDE_CODE not in out
    assert "plugin art_hydra.validators:rule: acme_rules" in out
    assert str(site / "acme_rules.py") in out
    assert "sitecustomize" in out and str(site / "sitecustomize.py") in out
