"""The ``art-hydra`` command (also ``python -m art_hydra``): a thin Hydra entry point.

A single run is composed once, exactly as Hydra composes it, and checked once (the
config alone, then the world pre-flight against the run folder Hydra will use), so a
configuration that cannot work is rejected with one complete report before an output
directory, a model or a queue exists (Hydra 1.3 has no compose-time hook, and it turns
exceptions in callbacks into warnings). That same composition then runs as Hydra's
job (:mod:`art_hydra.commands.launch`): nothing is composed or checked twice. A sweep (``-m``,
or ``hydra.mode=MULTIRUN`` as plain Hydra reads it) goes to Hydra and the pre-flight
sweeper, which checks every point before the first job starts; every sweep job checks
its own config in :func:`art_hydra.train` (it may run on another machine).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import hydra
from hydra.core.config_loader import ConfigLoader
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from art_hydra.config import hydra_compat
from art_hydra.config.composition import (
    CONFIG_NAME,
    Composition,
    announce_warnings,
    compose_and_check,
    config_path,
    make_loader,
    open_mapping_adds,
    revealed_by_fixes,
)
from art_hydra.config.fix_chain import settled
from art_hydra.config.problems import ConfigValidationError, Problem, format_report
from art_hydra.config.store import register_configs
from art_hydra.config.trust import Hand, by_hand, hand_of, trust_problems
from art_hydra.errors import full_error
from art_hydra.import_path import import_named_from
from art_hydra.runs import interrupts


@hydra.main(config_path=config_path(), config_name=CONFIG_NAME, version_base="1.3")
def hydra_main(cfg: DictConfig) -> Any:
    """Hydra's task function for a job Hydra composed (a sweep's, or a run from a
    relative ``-cp``): it checks its own config in ``train``, where the heavy imports
    happen. Returns the job's :class:`~art_hydra.engine.result.RunResult`: a float (the
    objective) that an optimising sweeper (Optuna, Ax, Nevergrad) reads, carrying the
    run's summary."""
    from hydra.core.hydra_config import HydraConfig

    from art_hydra.commands.launch import anchor_paths, as_job
    from art_hydra.engine.distributed import adopt_submitit_tasks

    if adopt_submitit_tasks():
        _log_per_rank(HydraConfig.get().job.name)
    anchor_paths(cfg)
    return as_job(lambda: _train_composed(cfg))


def _train_composed(cfg: DictConfig) -> Any:
    from hydra.core.hydra_config import HydraConfig

    from art_hydra.run import train

    # A sweep's job may run in another process (joblib, submitit): the modules its own
    # command line names come from the folder the sweep was launched in, as for a run.
    hydra_cfg = HydraConfig.get()
    _import_named_from_working_folder(list(hydra_cfg.overrides.task), hydra_cfg.runtime.cwd)
    hand = _job_hand()
    refused = trust_problems(cfg, hand)  # (a sweep's points were checked before it started)
    if refused:
        raise ConfigValidationError(refused, footer="The run stopped before loading a model.")
    with by_hand(hand):
        return train(cfg)


def _job_hand() -> Hand:
    """What the user set by hand for this job: its command-line overrides (a sweep's
    points were checked against the command line alone by the pre-flight sweeper)."""
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    groups = set(hydra_cfg.runtime.choices)
    given: Any = OmegaConf.to_container(hydra_cfg.overrides, resolve=False)
    return hand_of([*given["hydra"], *given["task"]], lambda name: name in groups)


def _log_per_rank(job_name: str) -> None:
    """Each task of a multi-task submitit job runs this job in the same folder; ranks
    other than 0 log to ``<job name>_rank<N>.log`` instead of interleaving with rank 0."""
    rank = int(os.environ.get("RANK", "0"))
    if rank == 0:
        return
    root = logging.getLogger()
    for handler in list(root.handlers):
        path = getattr(handler, "baseFilename", "")
        if isinstance(handler, logging.FileHandler) and path.endswith(f"{job_name}.log"):
            own = logging.FileHandler(path[: -len(".log")] + f"_rank{rank}.log")
            own.setFormatter(handler.formatter)
            own.setLevel(handler.level)
            root.removeHandler(handler)
            handler.close()
            root.addHandler(own)


def main() -> None:
    """Console-script entry: check first, then hand the same argv to Hydra. A stop
    signal before the training loop ends the command with one line and the shell's
    status (:mod:`art_hydra.runs.interrupts`), never a traceback. ``art-hydra summarize
    SWEEP_DIR`` summarises a sweep folder instead (:mod:`art_hydra.sweeps.summary`);
    ``art-hydra export`` and ``art-hydra generate`` export and try a trained model
    (:mod:`art_hydra.commands.export`, :mod:`art_hydra.commands.generate`)."""
    if sys.argv[1:2] == ["summarize"]:
        from art_hydra.sweeps.summary import main as summarize

        sys.exit(summarize(sys.argv[2:]))
    if sys.argv[1:2] in (["export"], ["generate"]):
        # A Hydra override always holds '=' (or starts with '+', '~', '-'): a bare word
        # first is one of these commands, never a run's override.
        from art_hydra.commands import export, generate

        command = export if sys.argv[1] == "export" else generate
        sys.exit(command.main(sys.argv[2:]))
    interrupts.exit_on_signals()
    _import_named_from_working_folder(sys.argv[1:], os.getcwd())
    try:
        _main()
    except KeyboardInterrupt:
        # Only where Python's own SIGINT handler came back (exit_on_signals replaces it).
        interrupts.say(
            "\nart_hydra: SIGINT (Ctrl-C) received before training began: nothing was "
            "trained or saved; run the same command again to start.\n"
        )
        sys.exit(130)


#: The keys whose value names code (a dotted path) the user may keep in the working
#: folder: a reward, a generator, ``task.allowed_modules``, any ``_target_`` set by hand.
_CODE_KEY = re.compile(
    r"^(task\.generator|task\.reward|task\.allowed_modules(\.\d+)?"
    r"|(task|hydra)(\.[^.]+)*\._target_)$"
)


def named_modules(overrides: list[str]) -> set[str]:
    """The top-level modules ``overrides`` name as code (``task.reward._target_=m.f``,
    ``'task.rewards=[{_target_: m.f}]'``, ``task.allowed_modules=[m]``, a sweep over
    several): the only modules the working folder may provide."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    names: set[str] = set()
    for text in overrides:
        try:
            override = parser.parse_override(text)
            values = (
                list(override.sweep_string_iterator())
                if override.is_sweep_override()
                else [override.value()]
            )
        except Exception:
            continue  # composition reports it
        if override.is_delete() or "/" in override.key_or_group:
            continue
        for value in values:
            for key, leaf in _leaves(override.key_or_group, value):
                if isinstance(leaf, str) and _CODE_KEY.match(key):
                    # A sweeper's params hold "a.f,b.g"; a dotted path has no comma.
                    names.update(p.strip().partition(".")[0] for p in leaf.split(","))
    return {n for n in names if n.isidentifier()}


def _leaves(key: str, value: Any) -> Iterator[tuple[str, Any]]:
    """Each leaf of an override's value with its full key (list items by index)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _leaves(f"{key}.{k}", v)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _leaves(f"{key}.{i}", v)
    else:
        yield key, value


def _import_named_from_working_folder(overrides: list[str], folder: str) -> None:
    """Make the modules the command line names importable from the working folder.

    A console script's ``sys.path[0]`` is its own folder (the environment's ``bin``), so
    without this ``art-hydra task.reward._target_=my_rewards.score`` could not import the
    ``my_rewards.py`` beside the user's data. Only the named modules, and after every
    installed one: the folder itself is never on the import path
    (:mod:`art_hydra.import_path`), so a ``yaml.py``, a ``hydra_plugins/`` or a
    ``*.dist-info`` lying there stays data. Trust does not widen: which functions may run
    is still decided by the markers and the user's hand
    (:mod:`art_hydra.config.targets`)."""
    import_named_from(folder, named_modules(overrides))


def _main() -> None:
    if "--schema" in sys.argv[1:]:
        _print_schema(sys.argv[1:])
    # '+task.params.x=1' adds a generator argument whether or not the task sets it: the
    # same argv goes to the check and to Hydra.
    # A fix pasted after the command line replaces what it names (config/fix_chain.py).
    sys.argv[1:] = settled(open_mapping_adds(sys.argv[1:]))
    args = hydra_compat.args_parser().parse_args()
    register_configs()  # also for -cp folders, which Hydra loads without importing them
    passthrough = (
        args.help
        or args.hydra_help
        or args.cfg
        or args.info
        or args.shell_completion
        or args.experimental_rerun  # Hydra's own: a pickled config, run as it was
    )
    if args.config_path is not None and not (
        args.config_path.startswith("pkg://") or os.path.isabs(args.config_path)
    ):
        resolved = hydra_compat.primary_search_dir(args.config_path, CONFIG_PATH_BASE)
        _replace_config_path(sys.argv, args.config_path, resolved)
        args.config_path = resolved
    if not passthrough:
        precheck = _precheck(args)
        if precheck is not None:  # a single run, checked: it runs from that composition
            checked, loader = precheck
            _run_checked(checked, loader, args)
            return
    from art_hydra.sweeps.plugins import register_sweeper, wrap_launchers

    register_sweeper()  # after the check: Hydra's plugin scan imports every launcher
    wrap_launchers()
    hydra_main()
    from art_hydra.sweeps.launching import CheckedLaunches

    if CheckedLaunches.current is not None:  # a sweep: its summary, its exit status
        CheckedLaunches.current.finish()


#: A relative ``--config-path`` is read against the ``art_hydra`` package (``-cp conf`` is
#: the shipped ``conf/``), as Hydra's entry point read it while the command lived in
#: ``art_hydra/cli.py``; from ``art_hydra.commands`` it would read ``art_hydra/commands/conf``.
CONFIG_PATH_BASE = "art_hydra.__main__"


def _replace_config_path(argv: list[str], given: str, resolved: str) -> None:
    """Hand Hydra's own parse (sweeps, ``--cfg``) the path the check read: the relative
    ``-cp``/``--config-path`` value in ``argv`` becomes ``resolved``."""
    for i, arg in enumerate(argv):
        if arg in ("-cp", "--config-path") and i + 1 < len(argv) and argv[i + 1] == given:
            argv[i + 1] = resolved
        elif arg in (f"-cp={given}", f"--config-path={given}"):
            argv[i] = f"{arg.split('=', 1)[0]}={resolved}"


def _print_schema(argv: list[str]) -> None:
    """``art-hydra --schema [--config-dir DIR]``: print the JSON Schema of config files
    (with DIR's groups and options added) for an editor, and exit before Hydra runs."""
    import argparse

    from art_hydra.config.json_schema import render

    parser = argparse.ArgumentParser(prog="art-hydra --schema")
    parser.add_argument("--schema", action="store_true")
    parser.add_argument("--config-dir", "-cd", action="append", default=[])
    args = parser.parse_args(argv)
    missing = [d for d in args.config_dir if not os.path.isdir(d)]
    if missing:
        sys.stderr.write(f"--config-dir {missing[0]}: no such folder\n")
        sys.exit(1)
    sys.stdout.write(render(args.config_dir))
    sys.exit(0)


def _precheck(args: Any) -> tuple[Composition, ConfigLoader] | None:
    """Reject bad configs before Hydra creates anything; serve single-run dry runs.
    Returns the checked single run and its loader (None for a sweep, which its sweeper
    checks)."""
    from art_hydra.config.problems import format_report
    from art_hydra.config.yaml_guard import config_file_problems
    from art_hydra.preflight import add_world_problems

    unsafe = config_file_problems(args.config_dir, args.config_path)
    if unsafe:
        sys.stderr.write(format_report(unsafe) + "\n")
        sys.exit(1)
    loader = make_loader(args.config_dir, args.config_path)
    config_name = args.config_name or CONFIG_NAME
    overrides = list(args.overrides)
    if args.multirun or (
        _asks_for_a_sweep(overrides)
        and hydra_compat.run_mode(loader, config_name, overrides) == RunMode.MULTIRUN
    ):
        # Only the master can be checked here; the sweeper checks every point.
        master = compose_and_check(loader, config_name, overrides, RunMode.MULTIRUN, validate=False)
        _refuse_a_sweep_under_torchrun(master)
        _reject_if_bad(master)
        return None
    result = compose_and_check(loader, config_name, overrides, RunMode.RUN, keep_composed=True)
    if result.hydra is not None and result.hydra.mode == RunMode.MULTIRUN:
        # The config's own hydra.mode asks for a sweep: the sweeper checks every point, and
        # the master is checked here, before Hydra runs its callbacks and logging config.
        master = compose_and_check(loader, config_name, overrides, RunMode.MULTIRUN, validate=False)
        _refuse_a_sweep_under_torchrun(master)
        _reject_if_bad(master)
        return None
    reuse: dict = {}  # the environment's verdicts, for this report's configs alone
    world = functools.partial(add_world_problems, reuse=reuse)
    world(result)
    if not result.ok:  # the fixes' own problems join the report: refusals only
        revealed = revealed_by_fixes(result, loader, config_name, overrides, world)
        _reject_if_bad(result, revealed)
    announce_warnings(result.problems)
    assert result.resolved is not None
    if result.resolved.dry_run:
        from art_hydra.run import dry_run_report

        print(dry_run_report(result.resolved, result.hydra, before_hydra=True))
        sys.exit(0)
    return result, loader


def _run_checked(checked: Composition, loader: ConfigLoader, args: Any) -> None:
    """Run the checked single run as Hydra's job (:mod:`art_hydra.commands.launch`); the
    ranks of a torchrun job that cannot meet end with a report."""
    from art_hydra.commands.launch import report_and_exit, run_checked

    config_name = args.config_name or CONFIG_NAME
    try:
        run_checked(checked, loader, config_name, list(args.overrides))
    except CompactHydraException as exc:
        if full_error():
            raise
        report_and_exit(exc)


def _refuse_a_sweep_under_torchrun(result: Composition) -> None:
    """Every rank would run the whole sweep; a sweep of multi-rank jobs is the SLURM
    launcher preset's work (each job one multi-process job)."""
    from art_hydra.config.launch_plan import torchrun_world_size
    from art_hydra.config.problems import Kind, Problem, fix

    if (torchrun_world_size() or 1) > 1:
        result.problems.append(
            Problem(
                "--multirun",
                f"WORLD_SIZE={torchrun_world_size()}",
                "torchrun started this command once per rank, and a sweep would run every "
                "job on every rank; a sweep of multi-rank jobs sends each job to the launcher "
                "as a whole (hydra/launcher=slurm, or slurm_local to try it on one machine).",
                fix(note="art-hydra -m hydra/launcher=slurm ... (without torchrun)"),
                Kind.override,
            )
        )


def _asks_for_a_sweep(overrides: list[str]) -> bool:
    """Whether Hydra might run these overrides as a sweep without -m (``hydra.mode`` set
    on the command line, or a value listing several choices); deciding it costs a
    composition, so the common single run skips it."""
    return any(o.lstrip("+~").startswith("hydra.mode") or "," in o for o in overrides)


def _reject_if_bad(result: Composition, revealed: Sequence[tuple[int, Problem]] = ()) -> None:
    """Refuse ``result`` with its report; ``revealed``: the errors its fixes reveal
    (a single run's; a sweep's master is refused on its own problems)."""
    if result.ok:
        return
    if full_error():
        raise ConfigValidationError(result.problems, revealed=revealed)
    sys.stderr.write(format_report(result.problems, revealed=revealed) + "\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
