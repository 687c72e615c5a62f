"""The distinct-prompt pass on hybrid and state-space caches.

A group's prompt is read once and its cache copied to each completion. Hybrid layers
(Falcon-H1's attention + Mamba, Qwen3-Next's gated delta net, ...) keep convolution and
recurrent states beside (or instead of) key/value rows; transformers' own
``batch_select_indices`` copies the key/value rows only, so before this copy Falcon-H1
crashed at its first decoding step ("Expected size 2 but got size 16"). Here every family
of ``HYBRIDS`` samples the same tokens and logprobs with the copy as with every prompt
read once per completion; a cache the copy cannot make whole falls back to the latter;
a model without a cache stops the run with a message; and a Falcon-H1 folder trains
with RL through the real command, synchronous and overlapped.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from conftest import output_of
from family_models import HYBRIDS, build_family, family_params, save_family

from art_hydra.engine.backends.tiny import build_tokenizer
from art_hydra.engine.metrics import read_metrics
from art_hydra.engine.rl import sampling
from art_hydra.engine.rl.sampling import SamplingSettings, sample, suppressed_ids
from art_hydra.errors import RunStopped

ATOL = 1e-4


def _model(model_type: str, extra: dict[str, Any]) -> Any:
    return build_family(model_type, extra).eval()


def _sample(model: Any, prompts: list[list[int]], each_copy: bool) -> tuple[list, list]:
    """Sample 6 tokens per prompt, the distinct-prompt pass on or (``each_copy``) off."""
    tok = build_tokenizer()
    settings = SamplingSettings(suppress_ids=suppressed_ids(tok))
    sampling._ROWS_FIXED.discard(sampling._base_class(model))
    if each_copy:
        sampling._ROWS_FIXED.add(sampling._base_class(model))
    try:
        return sample(
            model,
            prompts,
            6,
            settings,
            (tok.eos_token_id,),
            tok.pad_token_id,
            torch.Generator().manual_seed(1),
            left_padding=False,
        )
    finally:
        sampling._ROWS_FIXED.discard(sampling._base_class(model))


def _group_prompts() -> list[list[int]]:
    """Two prompts of 5 tokens, each three times (a group of three completions)."""
    tok = build_tokenizer()
    gen = torch.Generator().manual_seed(0)
    prompts = [[tok.bos_token_id, *torch.randint(6, len(tok), (4,), generator=gen).tolist()]]
    prompts.append([tok.bos_token_id, *torch.randint(6, len(tok), (4,), generator=gen).tolist()])
    return [p for p in prompts for _ in range(3)]


def _assert_same(a: tuple[list, list], b: tuple[list, list], name: str) -> None:
    assert a[0] == b[0], name
    for x, y in zip(a[1], b[1], strict=True):
        assert torch.allclose(torch.tensor(x), torch.tensor(y), atol=ATOL), name


@pytest.mark.parametrize("name", family_params(HYBRIDS))
def test_copied_states_sample_as_reading_every_copy(name: str) -> None:
    model_type, extra = HYBRIDS[name]
    model = _model(model_type, extra)
    prompts = _group_prompts()
    copied = sampling._copy_rows
    used: list[bool] = []

    def spy(cache: Any, rows: torch.Tensor, size: int) -> bool:
        used.append(copied(cache, rows, size))
        return used[-1]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "_copy_rows", spy)
        shared = _sample(model, prompts, each_copy=False)
        assert used == [True], name  # the copy ran and made every state whole
        every = _sample(model, prompts, each_copy=True)
        assert used == [True], name  # ... and reading every copy did not try
    _assert_same(shared, every, name)


def test_a_state_the_copy_does_not_know_falls_back_to_every_copy() -> None:
    """A state whose batch is not its first dimension stays at the distinct count: the
    check finds it, and the prompts are read once per completion, with the same result."""
    layer = SimpleNamespace(keys=torch.zeros(2, 1, 3, 4), odd=torch.zeros(1, 2, 5))
    cache = SimpleNamespace(layers=[layer])
    assert not sampling._copy_rows(cache, torch.tensor([0, 0, 1, 1]), 2)
    assert layer.keys.shape[0] == 4 and layer.odd.shape == (1, 2, 5)

    model = _model(*HYBRIDS["falcon_h1"])
    prompts = _group_prompts()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sampling, "_copy_rows", lambda *_: False)
        fallen = _sample(model, prompts, each_copy=False)
        assert sampling._base_class(model) not in sampling._ROWS_FIXED  # _sample cleans up
    _assert_same(fallen, _sample(model, prompts, each_copy=True), "falcon_h1")


def test_the_copy_reaches_dict_and_list_states() -> None:
    """Conv/recurrent states kept per state index in dicts, a linear cache in a list on
    the cache object itself (MiniMax): all indexed; 0-d counters left alone."""
    rows = torch.tensor([1, 0, 1])
    layer = SimpleNamespace(
        conv_states={0: torch.arange(2.0).view(2, 1)},
        recurrent_states={0: None},
        cumulative=torch.tensor(7),
    )
    cache = SimpleNamespace(layers=[layer], linear_cache=[[], torch.arange(2.0).view(2, 1)])
    assert sampling._copy_rows(cache, rows, 2)
    assert layer.conv_states[0].flatten().tolist() == [1.0, 0.0, 1.0]
    assert cache.linear_cache[1].flatten().tolist() == [1.0, 0.0, 1.0]
    assert layer.recurrent_states == {0: None} and int(layer.cumulative) == 7


def test_a_model_without_a_cache_stops_the_run_with_its_reason() -> None:
    """RWKV returns its recurrent state as ``state``, no cache: the sampler cannot decode
    from it (the model pre-flight refuses such families before loading, this is the
    guard for any other)."""
    model = _model("rwkv", {})
    prompts = _group_prompts()
    for each_copy in (False, True):
        with pytest.raises(RunStopped, match="returned no cache") as info:
            _sample(model, prompts, each_copy)
        assert "algorithm=sft" in str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("overlap", [False, True], ids=["shared", "overlapped"])
def test_a_falcon_h1_folder_trains_with_rl_through_the_command(
    cli, tmp_path: Path, overlap: bool
) -> None:
    """The issue's crash: RL on a Falcon-H1 folder stopped at step 1. Groups of 4 share
    their prompt's pass; overlapped rollouts sample on a copy of the policy."""
    folder = save_family(tmp_path / "falcon_h1", *HYBRIDS["falcon_h1"])
    proc = cli(
        "model=pretrained",
        f"model.name={folder}",
        "model.finetune=full",
        "trainer.max_steps=3",
        "checkpoint.every_steps=0",
        "rl.num_generations=4",
        f"rl.overlap_rollouts={str(overlap).lower()}",
        "logging.progress_bar=off",
        "logging.tensorboard=false",
        "logging.plot=false",
        timeout=600,
    )
    assert proc.returncode == 0, output_of(proc)
    (run,) = [p.parent for p in tmp_path.glob("outputs/*/*/.hydra")]
    metrics = read_metrics(run)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(torch.isfinite(torch.tensor(m["loss"])) for m in metrics)
    assert metrics[0]["clip_fraction"] == 0.0  # step 1 is on-policy
