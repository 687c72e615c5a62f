"""``rollout.engine=vllm``: vLLM's offline engine, colocated in the trainer's process
(TRL's colocate mode, ART's shape), behind the rollout interface.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): its model is
reachable for in-place weight loads, and no spawned worker needs the script's
``if __name__ == "__main__"`` guard. After every optimizer step the policy's weights
reach it (:meth:`VLLMRollout.sync_weights`): the trained tensors for full fine-tuning,
or for LoRA either the new adapter (``rollout.vllm.lora_sync=adapter``, served as a vLLM
LoRA) or the adapter's deltas added to the base weights (``merged``). Token ids go in
and come out; logprobs are vLLM's ``processed_logprobs`` (after temperature and the
suppressed ids, as the trainer computes them). Every engine constraint that would fail
at start-up was checked before the model loaded (:mod:`art_hydra.preflight.rollout_engine`).

Only this module imports vLLM; it is imported only when a run selects the engine.
"""

from __future__ import annotations

import gc
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from art_hydra.config.rollout_rules import engine_lora_rank, engine_max_model_len, sleeps
from art_hydra.engine.rollout.base import LENGTH, STOP, Completion, Request
from art_hydra.errors import StallError

if TYPE_CHECKING:
    from art_hydra.config.schema import RunConfig
    from art_hydra.engine.rl.sampling import SamplingSettings

log = logging.getLogger("art_hydra")

#: vLLM's loggers that report, on every partial in-place load, the weights it was not
#: given: a LoRA run's merged sync gives the adapted modules only, on purpose.
_PARTIAL_LOAD_LOGGERS = (
    "vllm.model_executor.model_loader.reload.inplace",
    "vllm.model_executor.model_loader.reload.layerwise",
)

#: The prefix peft's ``LoraModel`` (the LoRA policy, see ``adapters.tuner``) puts on the
#: wrapped model's module names.
_LORA_PREFIX = "model."


def _engine_environment(device: str) -> None:
    """What vLLM reads from the environment, set before it is imported (a user's own
    setting wins): in-process engine core, quieter logs; on a CPU, no thread binding (it
    would pin the trainer's threads too)."""
    # Forced, not defaulted: with the engine core in a subprocess, the in-place weight
    # loads (a generator of tensors) could not reach its model.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    # Its start-up notes (tens of lines) would bury the run's own log; warnings stay, on
    # stderr (stdout is the command's own: art-hydra generate --json prints JSON there).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    if device == "cpu":
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")


def compute_dtype(loaded: Any) -> torch.dtype:
    """The dtype the trainer computes in (its autocast type, else its weights'): the
    engine samples in it, so the two sides differ by kernels alone."""
    if loaded.autocast is not None:
        return loaded.autocast
    if loaded.is_peft:
        from art_hydra.engine.backends.adapters import tuner

        base = tuner(loaded.model).model  # the wrapped model (a LoraModel has no get_base_model)
    else:
        base = loaded.model
    return next(base.parameters()).dtype


class VLLMRollout:
    """vLLM's offline ``LLM`` on the run's model folder, synced to the policy."""

    def __init__(self, loaded: Any, run: RunConfig, world: Any = None) -> None:
        settings = run.rollout.vllm
        device = loaded.device.type
        self.loaded = loaded
        self.adapter = loaded.is_peft and settings.lora_sync == "adapter"
        self.sleeps = sleeps(settings.sleep, device == "cuda", run.rl.overlap_rollouts)
        self._start(
            run.model.name,
            compute_dtype(loaded),
            engine_max_model_len(run),
            settings,
            device,
            seed=run.seed,
            revision=run.model.revision,
            trust_remote_code=run.model.trust_remote_code,
            lora_rank=engine_lora_rank(run) if self.adapter else None,
        )
        self.sync_weights()

    @classmethod
    def on_folder(
        cls,
        folder: str,
        dtype: torch.dtype,
        max_model_len: int,
        settings: Any,
        device: str,
        seed: int = 0,
        trust_remote_code: bool = False,
    ) -> VLLMRollout:
        """The engine on a model folder as it is (``art-hydra generate`` on an export):
        no policy to sync, nothing to sleep for."""
        engine = cls.__new__(cls)
        engine.loaded, engine.adapter, engine.sleeps = None, False, False
        engine._start(folder, dtype, max_model_len, settings, device, seed, None, trust_remote_code)
        return engine

    def _start(
        self,
        model: str,
        dtype: torch.dtype,
        max_model_len: int,
        settings: Any,
        device: str,
        seed: int,
        revision: str | None,
        trust_remote_code: bool,
        lora_rank: int | None = None,
    ) -> None:
        """Start vLLM's ``LLM`` (``settings``: the rollout.vllm section)."""
        self.dtype, self.max_model_len = dtype, max_model_len
        _engine_environment(device)
        threads, set_threads = torch.get_num_threads(), torch.set_num_threads
        started = time.perf_counter()
        import vllm

        kwargs: dict[str, Any] = {
            "model": model,
            "revision": revision,
            "trust_remote_code": trust_remote_code,
            "dtype": str(dtype).removeprefix("torch."),
            "seed": seed % 2**31,
            "max_model_len": max_model_len,
            "gpu_memory_utilization": settings.gpu_memory_utilization,
            "enforce_eager": settings.enforce_eager,
            "logprobs_mode": "processed_logprobs",
            "enable_prefix_caching": True,
            "enable_sleep_mode": self.sleeps,
        }
        if settings.kv_cache_gib is not None:  # (VLLM_CPU_KVCACHE_SPACE, if set, wins)
            kwargs["kv_cache_memory_bytes"] = int(settings.kv_cache_gib * 2**30)
        if lora_rank is not None:
            kwargs.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
        try:
            self.llm = vllm.LLM(**kwargs)
        finally:
            # vLLM's CPU worker cuts the process to one thread for serving and replaces
            # torch.set_num_threads with a no-op; the trainer shares this process and
            # sizes its threads (backend.cpu_threads, overlapped rollouts) itself.
            torch.set_num_threads = set_threads
            set_threads(threads)
        self.version = vllm.__version__
        self.start_s = time.perf_counter() - started
        for name in _PARTIAL_LOAD_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)
        #: What vLLM's sleep mode has freed ("weights", "kv_cache"), empty while awake.
        self.asleep: set[str] = set()
        self.lora_request: Any = None
        self.syncs = 0
        self.sync_s = 0.0
        self._folder = tempfile.mkdtemp(prefix="art_hydra_vllm_")

    def describe(self) -> str:
        how = (
            "a LoRA adapter"
            if self.adapter
            else "merged LoRA weights"
            if self.loaded is not None and self.loaded.is_peft
            else "the trained tensors"
        )
        asleep = ", asleep while the trainer steps" if self.sleeps else ""
        return (
            f"rollouts: vLLM {self.version} (colocated, {str(self.dtype).removeprefix('torch.')}, "
            f"max_model_len {self.max_model_len}{asleep}), started in {self.start_s:.1f}s; "
            f"{how} synced after every optimizer step"
        )

    # ---- generating ----------------------------------------------------------------

    def generate(
        self,
        requests: Sequence[Request],
        settings: SamplingSettings,
        generator: torch.Generator,
        timeout_s: float | None = None,
    ) -> list[Completion]:
        """One completion per request. Each request gets its own seed, drawn from the
        caller's ``generator``: the same stream state samples the same completions."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        self.wake()
        started = time.monotonic()
        base = int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device))
        # The never-sampled ids (pad, BOS, UNK) pushed out of reach before vLLM's processed
        # logprobs (a bias of -100: e^-100 of a token's mass, below float32's resolution of
        # the normaliser), as the trainer masks them before its log-softmax. A list of
        # allowed ids would be the whole vocabulary, checked per request.
        bias = dict.fromkeys(settings.suppress_ids, -100.0) or None
        params = [
            SamplingParams(
                n=1,
                temperature=settings.temperature,
                top_k=settings.top_k if settings.top_k > 0 else -1,
                top_p=settings.top_p,
                max_tokens=request.max_tokens,
                # The request's stop ids alone end it (a multi-turn rollout sets its own).
                stop_token_ids=list(request.stop_ids),
                ignore_eos=True,
                logprobs=0,
                seed=(base + index) % 2**63,
                detokenize=False,
                logit_bias=bias,
            )
            for index, request in enumerate(requests)
        ]
        prompts = [TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self.lora_request)
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            raise StallError(
                f"vLLM took {time.monotonic() - started:.0f}s to sample {len(requests)} "
                f"completions, more than timeouts.rollout_s={timeout_s:g}"
            )
        found = [
            self._completion(out.outputs[0], req)
            for out, req in zip(outputs, requests, strict=True)
        ]
        if self.sleeps:
            self.sleep()
        return found

    @staticmethod
    def _completion(output: Any, request: Request) -> Completion:
        tokens = list(output.token_ids)
        logprobs = [
            float(step[token].logprob) for step, token in zip(output.logprobs, tokens, strict=True)
        ]
        stopped = bool(tokens) and tokens[-1] in request.stop_ids
        return Completion(tokens, logprobs, STOP if stopped else LENGTH)

    # ---- weights -------------------------------------------------------------------

    @torch.no_grad()
    def sync_weights(self) -> None:
        """The policy's current weights into the engine; the prefix cache, computed with
        the old ones, is dropped."""
        started = time.perf_counter()
        self.wake(("weights",))  # the KV cache stays freed until the next generate
        if self.adapter:
            self._load_adapter()
        else:
            # A generator: one converted tensor at a time, never a second copy of the model.
            self.llm.collective_rpc(
                "reload_weights",
                kwargs={"weights_iterator": self._weights(), "is_checkpoint_format": True},
            )
            self.llm.reset_prefix_cache()
        self.syncs += 1
        self.sync_s += time.perf_counter() - started

    def _load_adapter(self) -> None:
        """The adapter saved as peft saves it, served under a new id (vLLM caches an
        adapter by id); the previous one is removed from the engine and the disk."""
        from vllm.lora.request import LoRARequest

        old = self.lora_request
        number = self.syncs + 1
        folder = os.path.join(self._folder, f"adapter-{number}")
        # The policy is a LoraModel, whose save_pretrained is the base model's (full weights).
        from pathlib import Path

        from art_hydra.engine.backends.adapters import save_adapters

        save_adapters(self.loaded.model, Path(folder))
        self.lora_request = LoRARequest(f"policy-{number}", number, folder)
        if old is not None:
            self.llm.llm_engine.remove_lora(old.lora_int_id)
            shutil.rmtree(old.lora_path, ignore_errors=True)

    def _weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(checkpoint name, tensor) in the engine's dtype: for full fine-tuning the
        trainable parameters; for LoRA every parameter of the base model, each adapted
        module's weight merged with its delta and the modules trained in full as trained.

        Every parameter, not the adapted ones alone: vLLM reloads a layer whole and
        fills what it was not given with uninitialised memory; a fused layer (q, k and v
        in one, with Qwen's biases) is one layer."""
        model = self.loaded.model
        if not self.loaded.is_peft:
            for name, param in model.named_parameters():
                if param.requires_grad:
                    yield name, param.detach().to(self.dtype)
            return
        from peft.tuners.lora import LoraLayer
        from peft.utils.other import ModulesToSaveWrapper

        from art_hydra.engine.backends.adapters import ADAPTER, tuner

        lora = tuner(model)
        merged, saved, skipped = {}, {}, set()
        for name, module in lora.named_modules():
            plain = name.removeprefix(_LORA_PREFIX)
            if isinstance(module, LoraLayer) and ADAPTER in module.lora_A:
                merged[f"{name}.base_layer.weight"] = (plain, module)
                skipped.update(f"{name}.{p}" for p, _ in module.named_parameters() if "lora_" in p)
            elif isinstance(module, ModulesToSaveWrapper):
                for pname, _ in module.original_module.named_parameters():
                    skipped.add(f"{name}.original_module.{pname}")
                for pname, _ in module.modules_to_save[ADAPTER].named_parameters():
                    saved[f"{name}.modules_to_save.{ADAPTER}.{pname}"] = f"{plain}.{pname}"
        for name, param in lora.named_parameters():
            if name in skipped:
                continue
            if name in merged:
                plain, module = merged[name]
                delta = module.get_delta_weight(ADAPTER).to(torch.float32)
                yield f"{plain}.weight", (param.detach().to(torch.float32) + delta).to(self.dtype)
                continue
            target = saved.get(name) or name.removeprefix(_LORA_PREFIX).replace(".base_layer.", ".")
            yield target, param.detach().to(self.dtype)

    # ---- memory --------------------------------------------------------------------

    def sleep(self) -> None:
        """vLLM's sleep level 1: weights offloaded, KV cache freed (CUDA only)."""
        if self.sleeps and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = {"weights", "kv_cache"}

    def wake(self, tags: tuple[str, ...] | None = None) -> None:
        """Bring back what ``tags`` names, or everything (vLLM wants a whole wake-up
        before it generates); a sync needs the weights only, so the KV cache is not back
        on the device while the trainer may still hold its step's memory."""
        if not self.asleep:
            return
        if tags is None:
            self.llm.wake_up()
            self.asleep = set()
            return
        waking = [tag for tag in tags if tag in self.asleep]
        if waking:
            self.llm.wake_up(tags=waking)
            self.asleep -= set(waking)

    def close(self) -> None:
        """Shut the engine down and free its memory and adapter folder."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            shutdown = getattr(core, "shutdown", None)
            if callable(shutdown):
                try:
                    shutdown()
                except Exception as exc:  # closing must not mask the run's own end
                    log.debug("vLLM shutdown: %s", exc)
            del llm
            gc.collect()
            _free_device_memory()
        shutil.rmtree(getattr(self, "_folder", ""), ignore_errors=True)


def _free_device_memory() -> None:
    """What a closed engine leaves on a GPU: vLLM's process groups and the allocator's
    cache, so a later engine in the same process (a sweep's next job, a test) gets the
    memory back."""
    try:
        from vllm.distributed.parallel_state import (
            destroy_distributed_environment,
            destroy_model_parallel,
        )

        destroy_model_parallel()
        destroy_distributed_environment()
    except Exception as exc:  # an older layout, or nothing was set up
        log.debug("vLLM teardown: %s", exc)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
