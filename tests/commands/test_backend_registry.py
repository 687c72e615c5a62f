"""Backends come from a registry: a backend declares itself once (its load function, what
it can do, its own world checks), and a user's launcher script that imports its module
trains with ``backend.name=<that name>``; what a backend cannot do is refused from its
declaration, naming the key, the value and the fix; every built-in is listed where
choices are."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from conftest import output_of, report_entries
from omegaconf import OmegaConf
from plugin_packages import install_package, run_launcher, with_site

from art_hydra.config.backends import backends, get_backend
from art_hydra.config.json_schema import build as build_schema
from art_hydra.config.schema import RunConfig
from art_hydra.engine.metrics import read_metrics

ROOT = Path(__file__).resolve().parents[2]

#: The user's module: one declaration on its load function (which wraps the torch
#: backend's), with what it cannot do and one world check of its own.
USER_BACKEND = '''
import sys

from art_hydra.config.backends import register_backend
from art_hydra.config.problems import Kind, Problem, Severity, fix


def no_checkpointing(cfg, devices_here):
    """Acme's kernels keep every activation."""
    if cfg.backend.gradient_checkpointing:
        yield Problem(
            "backend.gradient_checkpointing",
            True,
            "acme_torch keeps every activation; checkpointing is ignored.",
            fix({"backend.gradient_checkpointing": False}),
            Kind.world,
            Severity.warning,
        )


@register_backend(
    "acme_torch",
    several_ranks=False,
    overlap_rollouts=False,
    checks=(no_checkpointing,),
    help="the torch backend, counted",
)
def load(model_cfg, backend_cfg, seed, charset=None):
    """Acme's backend: the torch backend's model, announced."""
    from art_hydra.engine.backends.torch_backend import load as torch_load

    print("acme_torch: loading", model_cfg.name, file=sys.stderr)
    return torch_load(model_cfg, backend_cfg, seed, charset)


def broken_check(cfg, devices_here):
    raise RuntimeError("acme's check has a bug")


register_backend("acme_broken", load=load, checks=(broken_check,))
'''


def _launch(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    """The user's launcher: import the module that registers, then art_hydra's own CLI."""
    return run_launcher(tmp_path, "acme_backend", USER_BACKEND, *overrides)


@pytest.mark.slow
def test_a_launcher_script_trains_with_the_backend_its_module_registers(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = _launch(
        tmp_path,
        "backend.name=acme_torch",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=8",
        "checkpoint.every_steps=0",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        f"hydra.run.dir={run_dir}",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert "acme_torch: loading" in out  # the run loaded the model through the declaration
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]
    saved = OmegaConf.load(run_dir / "run_config.yaml")
    assert saved.backend.name == "acme_torch"


def test_what_the_launcher_s_backend_cannot_do_is_refused_from_its_declaration(
    tmp_path: Path,
) -> None:
    # Its own world check runs (a warning), and the name is known to validation.
    ok = _launch(
        tmp_path, "backend.name=acme_torch", "backend.gradient_checkpointing=true", "dry_run=true"
    )
    assert ok.returncode == 0, output_of(ok)
    assert "acme_torch keeps every activation" in output_of(ok)
    # several_ranks=False: two ranks are refused, naming the key, the value and the fix.
    ranks = _launch(tmp_path, "backend.name=acme_torch", "distributed.world_size=2", "dry_run=true")
    out = output_of(ranks)
    assert ranks.returncode == 1, out
    fix = "backend.name=torch (data-parallel over the ranks)"
    assert ("backend.name", "acme_torch", fix) in report_entries(out)
    assert "backend=acme_torch trains on one device" in out and "several_ranks" in out
    # overlap_rollouts=False: the same refusal Unsloth gets, from the capability.
    overlap = _launch(
        tmp_path, "backend.name=acme_torch", "rl.overlap_rollouts=true", "dry_run=true"
    )
    entries = report_entries(output_of(overlap))
    assert overlap.returncode == 1 and any(
        key == "rl.overlap_rollouts" and "backend.name=torch" in fix for key, _, fix in entries
    ), entries
    # A plugin backend's check that crashes is reported by name, not a traceback.
    broken = _launch(tmp_path, "backend.name=acme_broken", "dry_run=true")
    out = output_of(broken)
    assert broken.returncode == 1 and "Traceback" not in out, out
    assert "world check acme_broken: broken_check" in out and "acme's check has a bug" in out
    # A misspelt name gets the nearest registered one.
    bad = _launch(tmp_path, "backend.name=acme_trch", "dry_run=true")
    assert bad.returncode == 1
    assert ("backend.name", "acme_trch", "backend.name=acme_torch") in report_entries(
        output_of(bad)
    )


def test_a_misspelt_backend_gets_the_nearest_registered_name(cli) -> None:
    proc = cli("backend.name=unslot", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert ("backend.name", "unslot", "backend.name=unsloth") in report_entries(out)
    assert "is not a registered backend (torch, unsloth" in out


def test_the_built_in_backends_declare_what_the_checks_read() -> None:
    torch, unsloth = get_backend("torch"), get_backend("unsloth")
    assert torch is not None and unsloth is not None
    assert (torch.four_bit, torch.several_ranks, torch.overlap_rollouts) == (False, True, True)
    assert (unsloth.four_bit, unsloth.several_ranks, unsloth.overlap_rollouts) == (
        True,
        False,
        False,
    )
    assert unsloth.own_precision and unsloth.devices == ("cuda",)
    assert unsloth.requires == ("unsloth",) and unsloth.prepare == "unsloth"
    # Declared torch-free: the load functions are named, imported only when a run loads.
    assert torch.load == "art_hydra.engine.backends.torch_backend:load"
    assert unsloth.load == "art_hydra.engine.backends.unsloth_backend:load"


def test_every_built_in_backend_is_listed_in_the_key_reference_and_the_schema() -> None:
    builtins = [n for n, b in backends().items() if b.builtin]
    assert builtins[:2] == ["torch", "unsloth"]
    row = next(
        line
        for line in (ROOT / "docs" / "config-keys.md").read_text().splitlines()
        if line.startswith("| `backend.name` |")
    )
    assert f"a registered backend ({', '.join(builtins)})" in row
    for schema in (
        build_schema(),
        json.loads((ROOT / "art_hydra/config/run_config.schema.json").read_text()),
    ):
        prop = schema["$defs"]["BackendConfig"]["properties"]["name"]
        listed = json.dumps(prop)
        assert all(f'"{name}"' in listed for name in builtins), prop


def test_an_old_run_config_with_an_enum_value_still_loads() -> None:
    """A run folder written when backend.name was an Enum holds its name, which the
    string key reads as it is."""
    old = OmegaConf.create("backend:\n  name: unsloth\n  device: cuda\n")
    saved = OmegaConf.merge(OmegaConf.structured(RunConfig), old)
    assert saved.backend.name == "unsloth"


def test_an_installed_package_registers_its_backend_through_an_entry_point(
    cli, tmp_path: Path
) -> None:
    site = install_package(
        tmp_path,
        "acme_backend",
        USER_BACKEND,
        "art_hydra.backends",
        'acme = "acme_backend"',
        name="acme-backend",
    )
    proc = cli("backend.name=acme_torch", "dry_run=true", env=with_site(site))
    assert proc.returncode == 0, output_of(proc)
    # Without the package the name is unknown.
    assert cli("backend.name=acme_torch", "dry_run=true").returncode == 1
