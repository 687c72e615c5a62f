"""Hydra's own section from a config file is data (issue 32).

A config folder a user was handed (``--config-dir shared``) may set under ``hydra`` only
an allowlist of keys, each bounded (art_hydra/config/hydra_section.py): output folders
inside their root, a plain job name, thread-count variables, sweep parameters and the
documented fields of the installed sweeper and launcher. Logging comes only as a named
preset, search paths only from the command line, a plugin option typed by name is the
installed one, and every YAML file Hydra reads is read within bounds where Hydra reads
it. Each attack carries a payload and asserts that it did nothing; the command line
stays the user's.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from pathlib import Path

import pytest
from conftest import output_of, report_entries, run_cli, shared_config_dir

from art_hydra import ConfigValidationError, compose
from art_hydra.config import hydra_section

pytestmark = pytest.mark.fast

#: Nine levels of ten aliases: about a billion values once expanded.
BOMB = 'a0: &a0 ["x","x","x","x","x","x","x","x","x","x"]\n' + "".join(
    f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 9)
)


def _experiment(body: str) -> dict[str, str]:
    return {"experiment/x.yaml": "# @package _global_\n" + body}


def _problems(overrides: list[str], shared: Path) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as info:
        compose(overrides, config_dir=str(shared))
    return {p.key: p.reason for p in info.value.problems}


# ---- the reported attacks -----------------------------------------------------------------


def test_a_logging_handler_attribute_mapping_from_a_config_file_is_refused(
    tmp_path: Path,
) -> None:
    """logging.config sets a handler's '.' mapping as attributes: the log, with a format a
    file chose, would go to a shell start-up file."""
    bashrc = tmp_path / "bashrc"
    shared = shared_config_dir(
        tmp_path,
        _experiment(
            "hydra:\n  job_logging:\n    formatters:\n      simple:\n"
            "        format: 'touch pwned #'\n    handlers:\n      file:\n"
            "        filename: ${hydra.runtime.output_dir}/art_hydra.log\n"
            f"        .:\n          baseFilename: {bashrc}\n"
        ),
    )
    proc = run_cli("--config-dir", str(shared), "experiment=x", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.job_logging"]
    assert "hydra/job_logging=default" in out  # the fix: a named preset
    assert not bashrc.exists() and not (tmp_path / "outputs").exists()


def test_a_search_path_package_named_by_a_primary_config_is_never_imported(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "evilpkg").mkdir()
    (tmp_path / "evilpkg" / "__init__.py").write_text(f"open({str(marker)!r}, 'w')\n")
    shared = shared_config_dir(
        tmp_path,
        {"mine.yaml": "defaults:\n  - config\n  - _self_\nhydra:\n  searchpath: [pkg://evilpkg]\n"},
    )
    proc = run_cli("--config-dir", str(shared), "-cn", "mine", cwd=tmp_path, module=True)
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.searchpath"]
    assert not marker.exists()


def test_a_job_name_that_climbs_out_of_the_run_folder_is_refused(tmp_path: Path) -> None:
    """Hydra names the job's log file after it: ${output_dir}/../../../x.log."""
    shared = shared_config_dir(
        tmp_path, _experiment("hydra:\n  job:\n    name: ../../../escaped\n")
    )
    proc = run_cli("--config-dir", str(shared), "experiment=x", cwd=tmp_path)
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert [k for k, _, _ in report_entries(out)] == ["hydra.job.name"]
    assert not list(tmp_path.rglob("escaped.log")) and not (tmp_path / "outputs").exists()


def test_a_sweep_subdir_that_climbs_out_of_the_sweep_folder_is_refused(tmp_path: Path) -> None:
    shared = shared_config_dir(
        tmp_path, _experiment("hydra:\n  sweep:\n    subdir: ../victim_${seed}\n")
    )
    proc = run_cli(
        "--config-dir", str(shared), "-m", "experiment=x", "seed=1,2",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "hydra.sweep.subdir" in [k for k, _, _ in report_entries(out)]
    assert not list(tmp_path.glob("victim_*")) and not (tmp_path / "sweep").exists()


def test_a_config_folder_cannot_shadow_an_installed_option_typed_by_name(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    shared = shared_config_dir(
        tmp_path,
        {
            "hydra/sweeper/sampler/cmaes.yaml": "independent_sampler:\n  _target_: builtins.open\n"
            f"  file: {marker}\n  mode: w\n"
        },
    )
    proc = run_cli(
        "--config-dir", str(shared), "-m", "hydra/sweeper=optuna", "hydra/sweeper/sampler=cmaes",
        "hydra.sweeper.n_trials=1", "rl.temperature=interval(0.7,1.2)", "dry_run=true",
        f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path,
    )  # fmt: skip
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    assert "hydra/sweeper/sampler" in [k for k, _, _ in report_entries(out)]
    assert "an installed plugin" in out
    assert not marker.exists()


# ---- every YAML file Hydra reads is bounded where Hydra reads it ---------------------------


def _bomb_at(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("# @package _global_\n" + BOMB)
    return path


def _bomb_route(tmp_path: Path, route: str) -> tuple[list[str], Path]:
    """The arguments that make Hydra read a bomb by ``route``, and the bomb's file."""
    shared = tmp_path / "shared"
    (shared / "experiment").mkdir(parents=True)
    if route == "symlink":  # the folder scan skips links
        bomb = _bomb_at(shared / "data" / "bomb.txt")
        (shared / "experiment" / "bomb.yaml").symlink_to(bomb)
        return ["--config-dir", str(shared), "experiment=bomb"], bomb
    if route == "after_decoys":  # the folder scan stops after 10,000 files
        decoys = shared / "aaa_decoys"
        decoys.mkdir()
        for i in range(10_001):
            (decoys / f"d{i:05}.yaml").write_text("a: 1\n")
        return ["--config-dir", str(shared), "+zzz=bomb"], _bomb_at(shared / "zzz" / "bomb.yaml")
    if route == "search_path":  # a folder the folder scan never saw
        bomb = _bomb_at(tmp_path / "extra" / "experiment" / "bomb.yaml")
        return [f"hydra.searchpath=[file://{tmp_path / 'extra'}]", "experiment=bomb"], bomb
    # a defaults entry that climbs out of the config folder
    bomb = _bomb_at(tmp_path / "elsewhere" / "bomb.yaml")
    climb = "# @package _global_\ndefaults:\n  - /../elsewhere/bomb\n"
    (shared / "experiment" / "climb.yaml").write_text(climb)
    shared.rename(tmp_path / "conf")
    return ["--config-dir", str(tmp_path / "conf"), "experiment=climb"], bomb


@pytest.mark.parametrize("route", ["symlink", "after_decoys", "search_path", "climbing_default"])
def test_a_yaml_alias_bomb_is_refused_whichever_way_hydra_reaches_it(
    tmp_path: Path, route: str
) -> None:
    args, bomb = _bomb_route(tmp_path, route)
    proc = run_cli(*args, cwd=tmp_path, timeout=90)
    out = output_of(proc)
    assert proc.returncode == 1 and "Traceback" not in out, out
    entries = report_entries(out)
    assert len(entries) == 1, out
    assert os.path.realpath(entries[0][0]) == os.path.realpath(bomb), out
    assert "200,000 values" in out or "outside the config folder" in out
    assert not (tmp_path / "outputs").exists()


# ---- the allowlist -----------------------------------------------------------------------


def test_the_hydra_settings_real_configs_use_still_compose(tmp_path: Path) -> None:
    shared = shared_config_dir(
        tmp_path,
        _experiment(
            "hydra:\n  run:\n    dir: outputs/mine/${seed}\n  job:\n    name: my_job\n"
            "    chdir: false\n    env_set:\n      OMP_NUM_THREADS: '2'\n"
            "  sweeper:\n    params:\n      seed: 1,2\n"
        ),
    )
    cfg = compose(["experiment=x"], config_dir=str(shared), return_hydra_config=True)
    assert cfg.hydra.job.name == "my_job" and cfg.hydra.job.env_set.OMP_NUM_THREADS == "2"


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ("hydra:\n  help:\n    app_name: x\n", "hydra.help"),
        ("hydra:\n  run:\n    dir: /elsewhere/run\n", "hydra.run.dir"),
        ("hydra:\n  job:\n    env_copy: [PATH]\n", "hydra.job.env_copy"),
        ("hydra:\n  sweeper:\n    max_batch_size: 100000000\n", "hydra.sweeper.max_batch_size"),
        ("hydra:\n  launcher:\n    _target_: builtins.print\n", "hydra.launcher._target_"),
    ],
)
def test_hydra_settings_off_the_allowlist_are_refused_by_key(
    tmp_path: Path, body: str, key: str
) -> None:
    problems = _problems(["experiment=x"], shared_config_dir(tmp_path, _experiment(body)))
    assert key in problems, problems
    assert "on the command line" in str(problems) or "config file" in problems[key]


def test_the_same_settings_on_the_command_line_stay_the_users(tmp_path: Path) -> None:
    cfg = compose(
        ["hydra.job.name=../mine", "hydra.sweep.subdir=../s_${seed}", "hydra.help.app_name=x"],
        return_hydra_config=True,
    )
    assert cfg.hydra.job.name == "../mine" and cfg.hydra.help.app_name == "x"


def test_every_allowlisted_plugin_field_is_a_field_of_the_installed_plugin() -> None:
    """The allowlist names fields the plugins have: a typo would refuse a real setting."""
    configs = {
        "hydra_plugins.hydra_optuna_sweeper.config": [
            "OptunaSweeperConf", "TPESamplerConfig", "RandomSamplerConfig",
            "CmaEsSamplerConfig", "NSGAIISamplerConfig", "MOTPESamplerConfig",
        ],
        "hydra_plugins.hydra_submitit_launcher.config": ["SlurmQueueConf", "LocalQueueConf"],
        "hydra_plugins.hydra_joblib_launcher.config": ["JobLibLauncherConf"],
    }  # fmt: skip
    for module, names in configs.items():
        loaded = importlib.import_module(module)
        for name in names:
            conf = getattr(loaded, name)
            target = next(f.default for f in dataclasses.fields(conf) if f.name == "_target_")
            table = {**hydra_section.PLUGINS, **hydra_section.SAMPLERS}[target]
            fields = {f.name for f in dataclasses.fields(conf)}
            assert set(table) <= fields, (name, set(table) - fields)


def test_hydra_reads_every_config_file_through_the_bound() -> None:
    """The hook sits where Hydra's repository reads a file, and any loader (Hydra's own
    too) leaves a file's search path unfollowed: an upgrade that moves either fails here."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.config_repository import ConfigRepository

    from art_hydra.config import hydra_compat

    assert getattr(ConfigRepository.load_config, "_art_hydra_bounded", False)
    assert ConfigLoaderImpl._process_config_searchpath is hydra_compat._own_searchpath_only


@pytest.mark.parametrize("config_path", ["conf", "../../nowhere"])
def test_a_relative_config_path_is_checked_before_hydra_starts(
    tmp_path: Path, config_path: str
) -> None:
    """A relative ``-cp`` is read as Hydra reads it (against art_hydra's package) and
    checked like any other run: refused before Hydra creates a folder or a log."""
    proc = run_cli(
        "-cp", config_path, "algorithm=rl", "trainer.gradient_accumulation_steps=2", cwd=tmp_path
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "Traceback" not in out
    assert "Nothing was started" in out
    assert list(tmp_path.iterdir()) == []  # no outputs/, no log
