"""Third-party validators arrive through an entry point; the compose/validate path
never imports torch, transformers, peft or unsloth."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import output_of
from plugin_packages import install_package

PLUGIN = '''
from art_hydra import Problem, validator


@validator(name="acme.learning_rate_policy")
def learning_rate_policy(cfg):
    """ACME's rule: nothing above 1e-3."""
    if cfg.trainer.learning_rate > 1e-3:
        yield Problem("trainer.learning_rate", cfg.trainer.learning_rate,
                      "ACME policy: learning rates above 1e-3 diverge on our data.",
                      "trainer.learning_rate=1e-3")


def max_steps_policy(cfg):
    """Registered by the entry point alone, without the decorator."""
    if cfg.trainer.max_steps > 10_000:
        return [Problem("trainer.max_steps", cfg.trainer.max_steps,
                        "ACME policy: runs over 10k steps need approval.",
                        "trainer.max_steps=10000")]
    return []
'''

ENTRIES = """\
lr = "acme_checks:learning_rate_policy"
steps = "acme_checks:max_steps_policy"
"""


def _install_plugin(tmp_path: Path, entry_points_extra: str = "") -> Path:
    entries = ENTRIES + entry_points_extra
    return install_package(
        tmp_path, "acme_checks", PLUGIN, "art_hydra.validators", entries, name="acme-checks"
    )


def test_entry_point_validator_is_picked_up(cli, tmp_path: Path) -> None:
    site = _install_plugin(tmp_path)
    env = {"PYTHONPATH": str(site)}
    proc = cli(
        "trainer.learning_rate=0.01", "trainer.max_steps=20000", "checkpoint.every_steps=0", env=env
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "ACME policy: learning rates above 1e-3 diverge" in out
    assert "ACME policy: runs over 10k steps need approval" in out
    assert "fix: trainer.learning_rate=1e-3" in out
    # Passing values pass, and without the plugin the same config is fine.
    assert cli("trainer.max_steps=200", "dry_run=true", env=env).returncode == 0
    assert cli("trainer.learning_rate=0.01", "dry_run=true").returncode == 0


#: Every entry-point group a package can extend art_hydra through.
PLUGIN_GROUPS = (
    "art_hydra.validators",
    "art_hydra.world_checks",
    "art_hydra.policy_losses",
    "art_hydra.backends",
    "art_hydra.advantage_estimators",
)


def test_a_plugin_that_fails_to_import_is_named_whatever_it_extends(cli, tmp_path: Path) -> None:
    """A broken plugin in any group is one problem in the one report (a policy-loss
    plugin's was once dropped silently), whichever keys the config sets."""
    more = "".join(
        f'\n[project.entry-points."{group}"]\nbroken = "acme_missing_module"\n'
        for group in PLUGIN_GROUPS[1:]
    )
    site = _install_plugin(tmp_path, 'broken = "acme_missing_module:check"\n' + more)
    proc = cli("dry_run=true", env={"PYTHONPATH": str(site)})
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "cannot run (5 problems)" in out
    for group in PLUGIN_GROUPS:
        assert f"entry point {group}:broken" in out, group
    assert out.count("failed to import: ModuleNotFoundError") == 5
    assert not (tmp_path / "outputs").exists()


SCRIPT = textwrap.dedent("""
    import importlib.util, json, sys
    from art_hydra import ConfigValidationError, compose, validate, train
    from art_hydra.commands.cli import main

    validate(compose(["algorithm=sft"]))
    try:
        compose(["trainer.gradient_accumulation_steps=2", "trainer.learning_rate=abc"])
    except ConfigValidationError:
        pass
    try:
        train({"trainer": {"gradient_accumulation_steps": 2}})
    except ConfigValidationError:
        pass
    codes = []
    for argv in (["trainer.gradient_accumulation_steps=2", "+trainer.lerning_rate=1"],
                 ["dry_run=true"],
                 ["-m", "algorithm=rl,sft", "trainer.gradient_accumulation_steps=2"],
                 ["-m", "algorithm=rl,sft", "dry_run=true"]):
        sys.argv = ["art-hydra", *argv]
        try:
            main()
        except SystemExit as exc:
            codes.append(exc.code)
    heavy = sorted(m for m in sys.modules
                   if m.split(".")[0] in {"torch", "transformers", "peft", "unsloth"})
    print(json.dumps({"heavy": heavy, "codes": codes,
                      "torch_installed": importlib.util.find_spec("torch") is not None}))
""")


def test_compose_and_validate_never_import_heavy_modules(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["torch_installed"], "torch must be installed for this test to mean anything"
    # Rejected run, single dry run, rejected sweep exit through SystemExit; the dry-run
    # sweep returns normally.
    assert result["codes"] == [1, 0, 1], result
    assert result["heavy"] == []
    assert not (tmp_path / "outputs").exists()
