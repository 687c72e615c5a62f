"""Sharded training's composition rules (art_hydra/config/distributed_rules.py and the
sharding rule of config/inert.py), each both ways: the refused or warned config, and the
config next to it that passes. The world size comes from ``distributed.world_size`` (a
planned launch, which the checks judge as the launch it plans); composition reads no
files and imports no torch. One case goes through the real CLI."""

from __future__ import annotations

from typing import Any

import pytest
from hydra.types import RunMode

from art_hydra.config.composition import compose_and_check, make_loader
from art_hydra.config.problems import Problem, Severity
from tests.conftest import output_of, report_entries

pytestmark = pytest.mark.fast

TWO = ("distributed.world_size=2",)
FSDP = (*TWO, "distributed.strategy=fsdp")
#: The keys these rules name.
KEYS = {
    "distributed.strategy",
    "distributed.fsdp.reshard_after_forward",
    "distributed.fsdp.cpu_offload",
}


@pytest.fixture(scope="module")
def loader() -> Any:
    return make_loader()


def _found(loader: Any, *overrides: str) -> list[Problem]:
    """The problems that name one of :data:`KEYS`."""
    result = compose_and_check(loader, "config", list(overrides), RunMode.RUN)
    return [p for p in result.problems if p.key in KEYS]


def _shape(problems: list[Problem]) -> list[tuple[str, Severity]]:
    return [(p.key, p.severity) for p in problems]


def test_fsdp_on_two_ranks_of_the_torch_backend_passes(loader: Any) -> None:
    assert _found(loader, *FSDP) == []
    assert _found(loader, *FSDP, "distributed.fsdp.reshard_after_forward=false") == []
    assert _found(loader, *FSDP, "backend.device=cpu", "distributed.backend=gloo") == []


def test_a_backend_that_cannot_shard_is_refused_on_two_ranks(loader: Any) -> None:
    (problem,) = _found(loader, *FSDP, "backend=unsloth")
    assert (problem.key, problem.severity) == ("distributed.strategy", Severity.error)
    assert "Unsloth cannot be sharded" in problem.reason
    assert problem.fix.overrides() == ["backend=torch"]
    # Unsloth trains no second rank at all: no strategy=ddp alternative is offered.
    assert problem.fix.alt is None
    assert _found(loader, *FSDP, "backend=unsloth", *problem.fix.overrides()) == []


def test_a_backend_that_cannot_shard_on_one_rank_is_only_inert(loader: Any) -> None:
    found = _found(loader, "distributed.strategy=fsdp", "backend=unsloth")
    assert _shape(found) == [("distributed.strategy", Severity.warning)]
    assert "nothing is sharded" in found[0].reason


def test_fsdp_on_one_rank_is_inert_and_its_fix_is_the_default(loader: Any) -> None:
    (problem,) = _found(loader, "distributed.strategy=fsdp")
    assert (problem.key, problem.severity) == ("distributed.strategy", Severity.warning)
    assert problem.fix.overrides() == ["distributed.strategy=ddp"]
    assert _found(loader, "distributed.strategy=ddp") == []


def test_fsdp_settings_under_ddp_are_inert_and_read_under_fsdp(loader: Any) -> None:
    found = _found(loader, *TWO, "distributed.fsdp.reshard_after_forward=false")
    assert _shape(found) == [("distributed.fsdp.reshard_after_forward", Severity.warning)]
    assert "distributed.strategy=ddp keeps a whole copy" in found[0].reason
    assert found[0].fix.overrides() == ["distributed.strategy=fsdp"]
    assert _found(loader, *FSDP, "distributed.fsdp.reshard_after_forward=false") == []
    on_one = _found(loader, "distributed.fsdp.cpu_offload=true", "backend.device=cpu")
    assert _shape(on_one) == [("distributed.fsdp.cpu_offload", Severity.warning)]


def test_cpu_offload_on_the_cpu_is_refused_where_it_shards(loader: Any) -> None:
    cpu = ("backend.device=cpu", "distributed.backend=gloo")
    (problem,) = _found(loader, *FSDP, *cpu, "distributed.fsdp.cpu_offload=true")
    assert (problem.key, problem.severity) == ("distributed.fsdp.cpu_offload", Severity.error)
    assert "nothing to offload from" in problem.reason
    assert problem.fix.overrides() == ["distributed.fsdp.cpu_offload=false"]
    # backend.device=auto is the machine's to decide: the world pre-flight's.
    assert _found(loader, *FSDP, "distributed.fsdp.cpu_offload=true") == []


def test_offload_with_gathered_weights_kept_is_a_warning(loader: Any) -> None:
    keep = ("distributed.fsdp.cpu_offload=true", "distributed.fsdp.reshard_after_forward=false")
    (problem,) = _found(loader, *FSDP, *keep)
    assert (problem.key, problem.severity) == (
        "distributed.fsdp.reshard_after_forward",
        Severity.warning,
    )
    assert problem.fix.overrides() == ["distributed.fsdp.reshard_after_forward=true"]
    assert _found(loader, *FSDP, "distributed.fsdp.cpu_offload=true") == []


def test_the_cli_refuses_offload_on_the_cpu_and_runs_its_fix(cli) -> None:
    line = (*FSDP, "backend.device=cpu", "distributed.backend=gloo")
    refused = cli(*line, "distributed.fsdp.cpu_offload=true", "dry_run=true")
    out = output_of(refused)
    assert refused.returncode == 1, out
    entries = report_entries(out)
    assert ("distributed.fsdp.cpu_offload", "True", "distributed.fsdp.cpu_offload=false") in [
        (k, v, f.partition(" (")[0]) for k, v, f in entries
    ]
    fixed = cli(
        *line,
        "distributed.fsdp.cpu_offload=true",
        "distributed.fsdp.cpu_offload=false",
        "dry_run=true",
    )
    assert fixed.returncode == 0, output_of(fixed)


def test_an_engine_holding_its_own_weights_is_refused_where_the_policy_is_sharded(
    loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin engine declared with its own weights (not the policy in process, several
    ranks allowed) would be synced from shards under fsdp: refused, naming the built-in
    sampler; under ddp, or with the built-in sampler, the same run passes."""
    from art_hydra.config import rollout_engines

    monkeypatch.setitem(
        rollout_engines._engines,
        "acme_engine",
        rollout_engines.RolloutEngineDecl(
            name="acme_engine", build="acme:Engine", model_folder=False, module="acme"
        ),
    )
    result = compose_and_check(loader, "config", [*FSDP, "rollout.engine=acme_engine"], RunMode.RUN)
    (problem,) = [p for p in result.problems if p.key == "rollout.engine"]
    assert problem.severity == Severity.error and "holds weights of its own" in problem.reason
    assert "only the built-in sampler keeps a whole copy" in problem.reason
    assert problem.fix.overrides() == ["rollout.engine=torch"]
    assert problem.fix.alt.overrides() == ["distributed.strategy=ddp"]
    under_ddp = compose_and_check(
        loader, "config", [*TWO, "rollout.engine=acme_engine"], RunMode.RUN
    )
    assert [p for p in under_ddp.problems if p.key == "rollout.engine"] == []


def test_an_engine_sampling_from_the_policy_in_process_is_refused_where_it_shards(
    loader: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A plugin engine in the process, on the policy object (not the built-in sampler's
    whole copy), would run sharded forwards, collectives, for completions of different
    lengths on each rank."""
    from art_hydra.config import rollout_engines

    declared = rollout_engines.RolloutEngineDecl(
        name="acme_local",
        build="acme:Local",
        in_process_policy=True,
        model_folder=False,
        module="acme",
    )
    monkeypatch.setitem(rollout_engines._engines, "acme_local", declared)
    result = compose_and_check(loader, "config", [*FSDP, "rollout.engine=acme_local"], RunMode.RUN)
    (problem,) = [p for p in result.problems if p.key == "rollout.engine"]
    assert "samples from the policy itself" in problem.reason
    assert problem.fix.overrides() == ["rollout.engine=torch"]
    default = compose_and_check(loader, "config", list(FSDP), RunMode.RUN)
    assert [p for p in default.problems if p.key == "rollout.engine"] == []
