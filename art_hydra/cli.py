"""The ``art-hydra`` command (also ``python -m art_hydra``): a thin Hydra entry point.

Before Hydra runs anything, the command composes the config exactly as Hydra will and
validates it, so a configuration that cannot work is rejected with one complete report
before an output directory, a model or a queue exists (Hydra 1.3 has no compose-time
hook, and it turns exceptions in callbacks into warnings). With ``-m`` the pre-flight
sweeper (``hydra/sweeper=preflight``) checks every sweep point before the first job
starts; every job checks its own config again in :func:`art_hydra.run.train`.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import hydra
from hydra.types import RunMode
from omegaconf import DictConfig

from art_hydra.config.composition import CONFIG_NAME, Composition, compose_and_check, config_path
from art_hydra.config.problems import ConfigValidationError, format_report
from art_hydra.config.store import register_configs
from art_hydra.run import resolved_yaml


@hydra.main(config_path=config_path(), config_name=CONFIG_NAME, version_base="1.3")
def hydra_main(cfg: DictConfig) -> Any:
    """Hydra's task function: one job. Heavy imports happen inside ``train``."""
    from art_hydra.run import train

    return train(cfg)


def main() -> None:
    """Console-script entry: validate first, then hand the same argv to Hydra."""
    from hydra._internal.utils import get_args_parser

    args = get_args_parser().parse_args()
    register_configs()  # also for -cp folders, which Hydra loads without importing them
    passthrough = args.help or args.hydra_help or args.cfg or args.info or args.shell_completion
    primary = args.config_path
    # A relative -cp is resolved by Hydra against this module; leave that to the job check.
    checkable = primary is None or primary.startswith("pkg://") or os.path.isabs(primary)
    if not passthrough and checkable:
        _precheck(args)
    hydra_main()


def _precheck(args: Any) -> None:
    """Reject bad configs before Hydra creates anything; serve single-run dry runs."""
    from art_hydra.config.composition import make_loader

    loader = make_loader(args.config_dir, args.config_path)
    config_name = args.config_name or CONFIG_NAME
    overrides = list(args.overrides)
    if args.multirun:
        # Only the master can be checked here; the sweeper checks every point.
        result = compose_and_check(loader, config_name, overrides, RunMode.MULTIRUN, validate=False)
        _reject_if_bad(result)
        return
    result = compose_and_check(loader, config_name, overrides, RunMode.RUN)
    _reject_if_bad(result)
    cfg = result.config
    assert cfg is not None
    if cfg.hydra.mode == RunMode.MULTIRUN:
        return  # the config itself asks for a sweep: the pre-flight sweeper takes over
    if cfg.dry_run:
        print(resolved_yaml(cfg))
        print("dry run: the configuration is valid; nothing was trained or written.")
        sys.exit(0)


def _reject_if_bad(result: Composition) -> None:
    if result.ok:
        return
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        raise ConfigValidationError(result.problems)
    sys.stderr.write(format_report(result.problems) + "\n")
    sys.exit(1)


if __name__ == "__main__":
    main()
