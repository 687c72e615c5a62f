"""Only code the user chose, by the user's own hand (issue 15).

A config file may come from elsewhere (a shared ``--config-dir``): it may not widen
what runs, name a library gadget or art_hydra's own non-reward code as a reward, trust a
model's remote code, or run code through Hydra (callbacks, logging factories, launcher
setup lines). Each attack carries a payload that would create a marker file; each test
asserts the marker does not exist. The command line (the user's hand) still works.
"""

from __future__ import annotations

import importlib
import inspect
import json
import pickle
import pkgutil
from pathlib import Path

import pytest
from conftest import output_of, run_cli, write_model_files

from art_hydra import ConfigValidationError, compose
from art_hydra.config.targets import (
    ART_HYDRA_ENVIRONMENTS,
    ART_HYDRA_GENERATORS,
    ART_HYDRA_REWARDS,
    ART_HYDRA_TOOLS,
    role_of,
)

#: Budgets of a JSONL task on the tiny model (max_seq_length 64).
BUDGETS = ["rl.max_prompt_length=32", "rl.max_completion_length=32", "sft.max_length=64"]
GADGETS = ["numpy.load", "joblib.load", "pickle.load", "pandas.read_pickle", "torch.load"]


class _Payload:
    """Unpickling it creates the file ``path`` (no shell needed)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple:
        return (open, (str(self.path), "w"))


def _experiment(config_dir: Path, body: str, name: str = "shared") -> None:
    (config_dir / "experiment").mkdir(parents=True, exist_ok=True)
    (config_dir / "experiment" / f"{name}.yaml").write_text("# @package _global_\n" + body)


def _problems(overrides: list[str], config_dir: Path | None = None) -> dict[str, str]:
    with pytest.raises(ConfigValidationError) as info:
        compose(overrides, config_dir=str(config_dir) if config_dir else None)
    return {p.key: p.reason for p in info.value.problems}


# ---- the campaign's attack ------------------------------------------------------------


@pytest.mark.parametrize("dry_run", [False, True])
def test_a_shared_experiment_cannot_unpickle_through_numpy_load(
    tmp_path: Path, dry_run: bool
) -> None:
    marker = tmp_path / "pwned"
    (tmp_path / "p.pkl").write_bytes(pickle.dumps(_Payload(marker)))
    (tmp_path / "data.jsonl").write_text(json.dumps({"prompt": "p.pkl", "answer": "x"}) + "\n")
    shared = tmp_path / "shared"
    _experiment(shared, "task:\n  allowed_modules: [numpy]\n  reward:\n    _target_: numpy.load\n")
    proc = run_cli(
        "--config-dir",
        str(shared),
        "experiment=shared",
        "task=jsonl",
        "task.path=data.jsonl",
        *BUDGETS,
        f"dry_run={str(dry_run).lower()}",
        cwd=tmp_path,
    )
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "task.allowed_modules = ['numpy']" in out and "cannot widen" in out
    assert "task.reward._target_ = numpy.load" in out and "library 'numpy'" in out
    assert "Traceback" not in out
    assert not marker.exists()
    assert not (tmp_path / "outputs").exists()


# ---- targets that are never a reward or a generator ----------------------------------


@pytest.mark.parametrize(
    "target", [*GADGETS, "art_hydra.engine.metrics.plot_curve", "art_hydra.run.train"]
)
def test_gadgets_are_refused_at_composition_from_the_command_line(target: str) -> None:
    for key in ("task.reward._target_", "task.generator"):
        problems = _problems([f"{key}={target}"])
        assert key in problems, problems


@pytest.mark.parametrize("target", GADGETS)
def test_gadgets_are_refused_at_composition_from_a_config_file(tmp_path: Path, target: str) -> None:
    _experiment(tmp_path, f"task:\n  reward:\n    _target_: {target}\n")
    problems = _problems(["experiment=shared"], tmp_path)
    assert "library" in problems["task.reward._target_"]


def test_plot_curve_as_a_reward_is_refused_by_the_cli(cli, tmp_path: Path) -> None:
    proc = cli("task.reward._target_=art_hydra.engine.metrics.plot_curve", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1
    assert "is not one of art_hydra's own rewards" in out


def test_the_standard_library_is_refused_at_every_dotted_prefix() -> None:
    for target in ("os.path.join", "xml.etree.ElementTree.parse", "__main__.main"):
        assert "task.reward._target_" in _problems([f"task.reward._target_={target}"])


def test_allowed_modules_can_never_list_a_library() -> None:
    problems = _problems(["task.allowed_modules=[numpy]"])
    assert "can never be allowed" in problems["task.allowed_modules"]


def _function_or_class(obj: object) -> bool:
    return inspect.isfunction(obj) or inspect.isclass(obj)


def test_the_registry_is_exactly_art_hydras_marked_functions() -> None:
    import art_hydra.tasks

    marked: dict[str, set[str]] = {"reward": set(), "generator": set()}
    marked |= {"environment": set(), "tool": set()}
    for info in pkgutil.walk_packages(art_hydra.tasks.__path__, "art_hydra.tasks."):
        module = importlib.import_module(info.name)
        for name, fn in inspect.getmembers(module, _function_or_class):
            if fn.__module__ == info.name and role_of(fn) is not None:
                marked[role_of(fn)].add(f"{info.name}.{name}")
    assert marked == {
        "reward": set(ART_HYDRA_REWARDS),
        "generator": set(ART_HYDRA_GENERATORS),
        "environment": set(ART_HYDRA_ENVIRONMENTS),
        "tool": set(ART_HYDRA_TOOLS),
    }


# ---- the user's own functions ---------------------------------------------------------

USER_MODULE = """
from art_hydra import reward

open({marker!r}, "w").close()  # importing this module leaves a trace

@reward
def marked(prompt, completion, answer):
    return float(completion == answer)

def unmarked(prompt, completion, answer):
    return 1.0
"""


@pytest.fixture
def user_module(tmp_path: Path) -> Path:
    (tmp_path / "my_rewards.py").write_text(USER_MODULE.format(marker=str(tmp_path / "imported")))
    return tmp_path


def _user_cli(folder: Path, *args: str) -> tuple[int, str]:
    proc = run_cli(*args, "dry_run=true", cwd=folder, env={"PYTHONPATH": str(folder)})
    return proc.returncode, output_of(proc)


def test_a_marked_reward_named_by_a_config_file_runs_and_is_listed(user_module: Path) -> None:
    _experiment(user_module / "conf", "task:\n  reward:\n    _target_: my_rewards.marked\n")
    code, out = _user_cli(
        user_module, "--config-dir", str(user_module / "conf"), "experiment=shared"
    )
    assert code == 0, out
    assert "Code outside art_hydra that this run would import or execute" in out
    assert "reward: my_rewards.marked" in out and str(user_module / "my_rewards.py") in out


def test_an_unmarked_reward_named_by_a_config_file_is_refused_before_import(
    user_module: Path,
) -> None:
    _experiment(user_module / "conf", "task:\n  reward:\n    _target_: my_rewards.unmarked\n")
    code, out = _user_cli(
        user_module, "--config-dir", str(user_module / "conf"), "experiment=shared"
    )
    assert code == 1, out
    assert "not marked as a reward" in out and "task.reward._target_=my_rewards.unmarked" in out
    assert not (user_module / "imported").exists()  # refused from its source, unimported


def test_the_same_unmarked_reward_named_on_the_command_line_runs(user_module: Path) -> None:
    code, out = _user_cli(user_module, "task.reward._target_=my_rewards.unmarked")
    assert code == 0, out
    assert "reward: my_rewards.unmarked" in out


def test_a_sweep_parameter_in_a_config_file_is_not_the_users_hand(user_module: Path) -> None:
    _experiment(
        user_module / "conf",
        "hydra:\n  sweeper:\n    params:\n      task.reward._target_: my_rewards.unmarked\n",
    )
    code, out = _user_cli(
        user_module, "-m", "--config-dir", str(user_module / "conf"), "experiment=shared"
    )
    assert code == 1, out
    assert "not marked as a reward" in out


def test_allowed_modules_from_a_config_file_cannot_widen(tmp_path: Path) -> None:
    _experiment(tmp_path, "task:\n  allowed_modules: [my_rewards]\n")
    assert "cannot widen" in _problems(["experiment=shared"], tmp_path)["task.allowed_modules"]


def test_allowed_modules_on_the_command_line_still_works(user_module: Path) -> None:
    code, out = _user_cli(
        user_module, "task.allowed_modules=[my_rewards]", "task.reward._target_=my_rewards.unmarked"
    )
    assert code == 0, out


def test_rewards_are_called_by_parameter_name(tmp_path: Path) -> None:
    (tmp_path / "positional.py").write_text("def score(p, c, a):\n    return 1.0\n")
    code, out = _user_cli(tmp_path, "task.reward._target_=positional.score")
    assert code == 1
    assert "takes (p, c, a)" in out and "reward(prompt=..., completion=..., answer=...)" in out


def test_generators_are_called_by_parameter_name() -> None:
    from art_hydra.preflight import world_problems

    found = {p.key: p.reason for p in world_problems(compose(["+task.params.rng=3"]), None)}
    assert "gives every generator itself" in found["task.params.rng"]


# ---- remote model code ----------------------------------------------------------------


def _model_folder(root: Path) -> Path:
    config = {"model_type": "x", "vocab_size": 128, "auto_map": {"AutoModel": "modeling_x.X"}}
    folder = write_model_files(root / "remote_model", config)
    (folder / "modeling_x.py").write_text("raise SystemExit('remote code ran')\n")
    return folder


def test_trust_remote_code_from_a_config_file_is_refused(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    _experiment(tmp_path, f"model:\n  name: {folder}\n  trust_remote_code: true\n")
    problems = _problems(["model=qwen2_5_0_5b_instruct", "experiment=shared"], tmp_path)
    assert "only you may decide" in problems["model.trust_remote_code"]


def test_trust_remote_code_on_the_command_line_is_listed_by_the_dry_run(
    cli, tmp_path: Path
) -> None:
    folder = _model_folder(tmp_path)
    proc = cli(
        "model=qwen2_5_0_5b_instruct",
        f"model.name={folder}",
        "model.trust_remote_code=true",
        "dry_run=true",
    )
    out = output_of(proc)
    assert proc.returncode == 0, out
    assert f"remote model code: {folder}" in out and str(folder / "modeling_x.py") in out
    assert "modeling_x.X" in out


# ---- Hydra's own ways to run code -------------------------------------------------------


def test_a_callback_from_a_config_file_is_refused(cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _experiment(
        tmp_path / "conf",
        f"hydra:\n  callbacks:\n    evil:\n      _target_: builtins.open\n"
        f"      file: {marker}\n      mode: w\n",
    )
    proc = cli("--config-dir", str(tmp_path / "conf"), "experiment=shared")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "hydra.callbacks.evil" in out and "Hydra callback" in out
    assert not marker.exists()


def _logging_config(conf: Path, marker: Path) -> None:
    (conf / "hydra" / "job_logging").mkdir(parents=True)
    config = {
        "version": 1,
        "handlers": {"evil": {"()": "builtins.open", "file": str(marker), "mode": "w"}},
        "root": {"handlers": ["evil"]},
    }
    (conf / "hydra" / "job_logging" / "fancy.yaml").write_text(json.dumps(config))


def test_a_config_that_asks_for_a_sweep_is_checked_before_hydra_starts(cli, tmp_path: Path) -> None:
    """hydra.mode=MULTIRUN in a file (no -m): Hydra would run the callbacks before the
    sweeper's checks."""
    marker = tmp_path / "pwned"
    _experiment(
        tmp_path / "conf",
        f"hydra:\n  mode: MULTIRUN\n  callbacks:\n    evil:\n      _target_: builtins.open\n"
        f"      file: {marker}\n      mode: w\n",
    )
    proc = cli("--config-dir", str(tmp_path / "conf"), "experiment=shared", "dry_run=true")
    assert proc.returncode == 1, output_of(proc)
    assert "hydra.callbacks.evil" in output_of(proc)
    assert not marker.exists()


def test_a_logging_factory_chosen_by_a_config_file_is_refused(cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    conf = tmp_path / "conf"
    _logging_config(conf, marker)
    _experiment(conf, "", name="plain")
    (conf / "experiment" / "shared.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /hydra/job_logging: fancy\n"
    )
    proc = cli("--config-dir", str(conf), "experiment=shared")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "hydra.job_logging.handlers.evil.()" in out and "logging.config" in out
    assert not marker.exists()
    # Chosen on the command line it is the user's own logging config (a dry run: no job).
    proc = cli("--config-dir", str(conf), "hydra/job_logging=fancy", "dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "logging job_logging.handlers.evil.()" in proc.stdout
    # ... but not what another config file merges into the logging config chosen by hand.
    (conf / "experiment" / "merged.yaml").write_text(
        "# @package _global_\nhydra:\n  job_logging:\n    filters:\n      f:\n"
        "        (): builtins.print\n"
    )
    proc = cli("--config-dir", str(conf), "hydra/job_logging=fancy", "experiment=merged")
    assert proc.returncode == 1, output_of(proc)
    assert "hydra.job_logging.filters.f.()" in output_of(proc)
    assert "handlers.evil" not in output_of(proc)
    assert not marker.exists()


def test_a_log_file_that_could_become_code_is_refused(tmp_path: Path) -> None:
    """A FileHandler appending lines whose format a file chose to a shell start-up file."""
    startup = tmp_path / "bashrc"
    _experiment(
        tmp_path,
        "hydra:\n  job_logging:\n    formatters:\n      simple:\n        format: 'touch pwned #'\n"
        f"    handlers:\n      file:\n        filename: {startup}\n",
    )
    problems = _problems(["experiment=shared"], tmp_path)
    assert "not named *.log" in problems["hydra.job_logging.handlers.file.filename"]
    assert not startup.exists()


def test_launcher_setup_lines_from_a_config_file_are_refused(cli, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    _experiment(
        tmp_path / "conf",
        f"defaults:\n  - override /hydra/launcher: slurm\n"
        f"hydra:\n  launcher:\n    setup: ['touch {marker}']\n",
    )
    proc = cli("--config-dir", str(tmp_path / "conf"), "experiment=shared", "dry_run=true")
    out = output_of(proc)
    assert proc.returncode == 1, out
    assert "hydra.launcher.setup" in out and "shell lines" in out
    assert not marker.exists()


def test_a_line_break_in_a_launcher_value_from_a_config_file_is_refused(
    cli, tmp_path: Path
) -> None:
    """sbatch options become lines of the job script: a line break starts a command."""
    _experiment(
        tmp_path / "conf",
        "defaults:\n  - override /hydra/launcher: slurm\n"
        'hydra:\n  launcher:\n    comment: "x\\ntouch pwned"\n',
    )
    proc = cli("--config-dir", str(tmp_path / "conf"), "experiment=shared", "dry_run=true")
    assert proc.returncode == 1, output_of(proc)
    assert "hydra.launcher.comment" in output_of(proc) and "line break" in output_of(proc)


def test_hydra_env_variables_that_load_code_are_refused(tmp_path: Path) -> None:
    _experiment(tmp_path, "hydra:\n  job:\n    env_set:\n      LD_PRELOAD: /tmp/evil.so\n")
    assert "hydra.job.env_set.LD_PRELOAD" in _problems(["experiment=shared"], tmp_path)


def test_the_shipped_configs_run_no_code_outside_art_hydra(cli) -> None:
    proc = cli("dry_run=true")
    assert proc.returncode == 0, output_of(proc)
    assert "No code outside art_hydra" in proc.stdout


def test_a_function_marked_for_another_role_is_refused(user_module: Path) -> None:
    _experiment(user_module / "conf", "task:\n  generator: my_rewards.marked\n")
    code, out = _user_cli(
        user_module, "--config-dir", str(user_module / "conf"), "experiment=shared"
    )
    assert code == 1, out
    assert "not marked as a generator" in out


def test_an_unmarked_reexport_named_by_a_config_file_is_refused(user_module: Path) -> None:
    (user_module / "reexport.py").write_text("from my_rewards import unmarked as score\n")
    _experiment(user_module / "conf", "task:\n  reward:\n    _target_: reexport.score\n")
    code, out = _user_cli(
        user_module, "--config-dir", str(user_module / "conf"), "experiment=shared"
    )
    assert code == 1, out
    assert "not marked as a reward" in out


def test_train_from_python_lists_outside_code_in_its_dry_run(
    user_module: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from art_hydra import train

    monkeypatch.syspath_prepend(str(user_module))
    train(compose(["dry_run=true", "task.reward._target_=my_rewards.marked"]))
    out = capsys.readouterr().out
    assert "reward: my_rewards.marked" in out and str(user_module / "my_rewards.py") in out


@pytest.mark.slow
def test_a_marked_reward_named_by_a_config_file_trains(user_module: Path) -> None:
    _experiment(user_module / "conf", "task:\n  reward:\n    _target_: my_rewards.marked\n")
    proc = run_cli(
        "--config-dir",
        str(user_module / "conf"),
        "experiment=shared",
        "trainer.max_steps=2",
        "trainer.per_device_train_batch_size=16",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        cwd=user_module,
        env={"PYTHONPATH": str(user_module)},
        timeout=300,
    )
    assert proc.returncode == 0, output_of(proc)
    (metrics,) = (user_module / "outputs").glob("*/*/metrics.jsonl")
    assert len(metrics.read_text().splitlines()) == 2


def test_a_module_naming_a_relative_file_is_not_listed_as_outside_code(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """torch.ops names ``_ops.py`` (relative) as its file: resolved against the working
    folder it would be listed as code from there in every process that imported torch."""
    import sys
    import types

    from art_hydra import import_path

    monkeypatch.chdir(tmp_path)
    (tmp_path / "_ops.py").write_text("")
    fake = types.ModuleType("fake_torch_ops")
    fake.__file__ = "_ops.py"
    monkeypatch.setitem(sys.modules, "fake_torch_ops", fake)
    monkeypatch.setattr(import_path, "launched_as_command", lambda: True)
    listed = dict(import_path.outside_modules())
    assert "fake_torch_ops" not in listed
    real = types.ModuleType("fake_outside_code")
    real.__file__ = str(tmp_path / "_ops.py")  # an absolute file there is still listed
    monkeypatch.setitem(sys.modules, "fake_outside_code", real)
    assert "fake_outside_code" in dict(import_path.outside_modules())
