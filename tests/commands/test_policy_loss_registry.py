"""Policy losses come from a registry: a user's launcher script that imports its own
module (one decorated function) trains with ``rl.loss_type=<that name>``; a misspelt
name gets the nearest registered one; every built-in is listed where choices are."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import output_of, report_entries
from omegaconf import OmegaConf
from plugin_packages import install_package, run_launcher, with_site

from art_hydra.config.bounds import FIXED
from art_hydra.config.fields import field_info
from art_hydra.config.json_schema import build as build_schema
from art_hydra.config.policy_losses import policy_losses
from art_hydra.config.schema import RLConfig, RunConfig
from art_hydra.engine.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]

#: The user's module: one function, one decorator (REINFORCE: the unclipped ratio).
USER_LOSS = '''
from art_hydra.engine.rl.losses import register_policy_loss


@register_policy_loss(
    "acme_reinforce",
    metrics=("acme_negative_fraction",),
    help="REINFORCE with the importance ratio, unclipped.",
)
def acme_reinforce(ratio, logprobs, advantages, settings):
    """-r A per token; logs the share of tokens with a negative advantage."""
    return -ratio * advantages, {"acme_negative_fraction": advantages < 0}
'''


def _launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The user's launcher: import the module that registers, then art_hydra's own CLI."""
    return run_launcher(tmp_path, "acme_losses", USER_LOSS, *overrides)


@pytest.mark.slow
def test_a_launcher_script_trains_with_the_loss_its_module_registers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _launch(
        tmp_path,
        "rl.loss_type=acme_reinforce",
        "objective.metric=acme_negative_fraction",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "checkpoint.every_steps=0",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        f"hydra.run.dir={run_dir}",
    )
    assert proc.returncode == 0, output_of(proc)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2]
    # The user's statistic is logged: its function ran inside the trainer.
    assert all(0 <= r["acme_negative_fraction"] <= 1 for r in rows)
    assert "cispo_capped_fraction" not in rows[0]


def test_the_launcher_s_loss_is_known_to_validation(tmp_path: Path) -> None:
    ok = _launch(tmp_path, "rl.loss_type=acme_reinforce", "rl.epsilon=0.1", "dry_run=true")
    assert ok.returncode == 0, output_of(ok)
    # It reads neither clip setting, so a value given for one is reported inert.
    assert "rl.epsilon = 0.1" in output_of(ok) and "is never read" in output_of(ok)
    bad = _launch(tmp_path, "rl.loss_type=acme_reinforse", "dry_run=true")
    assert bad.returncode == 1
    assert ("rl.loss_type", "acme_reinforse", "rl.loss_type=acme_reinforce") in report_entries(
        output_of(bad)
    )


def test_a_misspelt_loss_gets_the_nearest_registered_name(cli) -> None:
    proc = cli("rl.loss_type=cipso", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert ("rl.loss_type", "cipso", "rl.loss_type=cispo") in report_entries(out)
    assert "is not a registered policy loss (ppo_clip, cispo" in out
    upper = output_of(cli("rl.loss_type=PPO_CLIP", "dry_run=true"))
    assert ("rl.loss_type", "PPO_CLIP", "rl.loss_type=ppo_clip") in report_entries(upper)


def test_every_built_in_loss_is_listed_in_the_key_reference_and_the_schema() -> None:
    builtins = [
        n for n, loss in policy_losses().items() if loss.module == "art_hydra.engine.rl.losses"
    ]
    assert builtins[:2] == ["ppo_clip", "cispo"]
    row = next(
        line
        for line in (ROOT / "docs" / "config-keys.md").read_text().splitlines()
        if line.startswith("| `rl.loss_type` |")
    )
    assert f"a registered policy loss ({', '.join(builtins)})" in row
    for schema in (
        build_schema(),
        json.loads((ROOT / "art_hydra/config/run_config.schema.json").read_text()),
    ):
        prop = schema["$defs"]["RLConfig"]["properties"]["loss_type"]
        listed = json.dumps(prop)
        assert all(f'"{name}"' in listed for name in builtins), prop


def test_an_old_run_config_with_an_enum_value_still_loads() -> None:
    """A run folder written when rl.loss_type was an Enum holds its name, which the
    string key reads as it is; the key stays fixed across a resume."""
    old = OmegaConf.create("rl:\n  loss_type: cispo\n  epsilon_high: 5.0\n")
    saved = OmegaConf.merge(OmegaConf.structured(RunConfig), old)
    assert saved.rl.loss_type == "cispo"
    assert field_info(RLConfig, "loss_type").resume == FIXED


def test_an_installed_package_registers_its_loss_through_an_entry_point(
    cli, tmp_path: Path
) -> None:
    site = install_package(
        tmp_path,
        "acme_losses",
        USER_LOSS,
        "art_hydra.policy_losses",
        'acme = "acme_losses"',
        name="acme-losses",
    )
    proc = cli("rl.loss_type=acme_reinforce", "dry_run=true", env=with_site(site))
    assert proc.returncode == 0, output_of(proc)
    # Without the package the name is unknown.
    assert cli("rl.loss_type=acme_reinforce", "dry_run=true").returncode == 1
