"""The task's environment and tools, checked before any model (RL and SFT alike).

When ``task.environment`` or ``task.tools`` is set:

1. each resolves through the trust rules (:func:`art_hydra.tasks.base.resolve_task_code`,
   as rewards do); the environment is a class with a callable ``reset`` and can be made
   with the entry's other keys (its constructor runs here, as a reward's does);
2. every tool (the class's public methods, :func:`~art_hydra.engine.envs.tools.environment_methods`,
   and the functions of ``task.tools``) yields a schema; an argument its docstring does
   not describe is a warning; two tools of one name are an error;
3. ``reset`` runs on the first :data:`ROWS` rows, each on a fresh instance, with the
   row's keys it accepts; a row it raises on is named with its ``where``;
4. the chat template (``model.chat_template``, else the model folder's) renders tool
   calls and tool results and yields the tool suffix
   (:func:`~art_hydra.engine.envs.template.check_template`); earlier turns that change
   as later ones are appended warn under RL and refuse SFT on multi-turn conversations;
5. the budgets: prompts rendered with the tools' schemas fit ``rl.max_prompt_length``
   (:data:`LENGTH_ROWS` rows: the length pre-flight counts prompts without tools); one
   tool suffix fits ``rl.max_completion_length``; ``rl.max_tool_calls`` calls fit it
   (``rl.max_prompt_length + rl.max_completion_length`` against ``model.max_seq_length``
   is composition's rule).

Also ``model.chat_template`` is read (always), and ``rl.sft_warm_start_steps`` needs
demonstrations (rows with a ``conversation``). User code runs here as it would at the
first rollout, bounded by ``timeouts.tool_s``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig

from art_hydra.config.problems import Problem, fix, placeholder
from art_hydra.config.schema import AlgorithmName, ModelSource
from art_hydra.config.targets import NotMarkedError, TargetError, key_role
from art_hydra.engine.envs import template as tpl
from art_hydra.engine.envs.tools import (
    ToolSchemaError,
    environment_methods,
    tool_schema,
    undescribed_arguments,
)
from art_hydra.errors import raised
from art_hydra.preflight.common import world_problem
from art_hydra.tasks.agent_code import (
    ENVIRONMENT_KEY,
    environment_kwargs,
    environment_path,
    reset_arguments,
    reset_row,
    tool_keys,
    uses_agent_code,
)
from art_hydra.tasks.base import iter_examples, resolve_task_code
from art_hydra.tasks.examples import Example, TaskDataError
from art_hydra.templates import template_refusal

#: Rows ``reset`` is called on.
ROWS = 4
#: Rows whose prompts are rendered with the tools' schemas for the prompt budget.
LENGTH_ROWS = 256
#: The character tokenizer's special tokens (the tiny model's, one token each).
_TINY_SPECIALS = {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>"}


@dataclass
class Agent:
    """What of the agent code resolved (``schemas``: every tool's, by name)."""

    env_class: type | None = None
    made: bool = False
    schemas: dict[str, dict[str, Any]] = field(default_factory=dict)


def environment_problems(cfg: DictConfig) -> list[Problem]:
    """Every problem of the task's agent code, chat template and budgets (see the module)."""
    problems = _chat_template_problems(cfg)
    agentic = uses_agent_code(cfg.task)
    if not agentic and not _warm_start(cfg):
        return problems
    rows = _rows(cfg, _warm_start(cfg), agentic and cfg.algorithm.name == AlgorithmName.sft)
    problems += _warm_start_problems(cfg, rows)
    if not agentic:
        return problems
    agent = Agent()
    problems += _class_problems(cfg, agent)
    problems += _tool_problems(cfg, agent)
    if agent.made:
        problems += _reset_problems(cfg, agent, rows.first)
    if not any(p.key == "model.chat_template" for p in problems):
        problems += _template_problems(cfg, agent, rows)
    return problems


# ---- the rows ----------------------------------------------------------------------


@dataclass
class Rows:
    """What the pass over the task's rows found."""

    first: list[tuple[str, Example]] = field(default_factory=list)
    sampled: list[tuple[str, Example]] = field(default_factory=list)
    demonstrations: int = 0
    multi_turn: str | None = None


def _warm_start(cfg: DictConfig) -> bool:
    return cfg.algorithm.name == AlgorithmName.rl and cfg.rl.get("sft_warm_start_steps", 0) > 0


def _rows(cfg: DictConfig, demonstrations: bool, multi_turn: bool) -> Rows:
    """The first rows, those measured, and whether any is a (multi-turn) demonstration
    (the pass goes on past :data:`LENGTH_ROWS` only to find a demonstration, or a
    multi-turn one, that is asked for); rows that cannot be read are the task
    pre-flight's to report."""
    from art_hydra.tasks.jsonl import Scan

    found = Rows()
    try:
        for where, example in iter_examples(cfg, Scan()):
            if len(found.first) < ROWS:
                found.first.append((where, example))
            if len(found.sampled) < LENGTH_ROWS:
                found.sampled.append((where, example))
            conversation = getattr(example, "conversation", None)
            if conversation is not None:
                found.demonstrations += 1
                if found.multi_turn is None and _multi_turn(conversation):
                    found.multi_turn = where
            enough = not demonstrations or found.demonstrations
            if enough and len(found.sampled) >= LENGTH_ROWS and not multi_turn:
                break
            if enough and found.multi_turn is not None:
                break
    except Exception:  # a source or generator that fails: the task check names it
        pass
    return found


def _multi_turn(conversation: Sequence[Any]) -> bool:
    """A conversation with tool results or more than one assistant turn."""
    roles = []
    for message in conversation:
        try:
            data = json.loads(message) if isinstance(message, str) else message
            roles.append(data.get("role") if isinstance(data, dict) else data[0])
        except (ValueError, TypeError, IndexError, AttributeError):
            continue
    return "tool" in roles or roles.count("assistant") > 1


def _warm_start_problems(cfg: DictConfig, rows: Rows) -> list[Problem]:
    steps = cfg.rl.get("sft_warm_start_steps", 0)
    if not _warm_start(cfg) or rows.demonstrations:
        return []
    return [
        world_problem(
            "rl.sft_warm_start_steps",
            steps,
            "warm-starts on the task's demonstrations (rows with a conversation to imitate: "
            "TRL's conversational messages with the assistant's turns), and the task has none.",
            fix(
                {"rl.sft_warm_start_steps": 0},
                "no warm start",
                alt=fix(note="add demonstrations: rows whose messages end in assistant turns"),
            ),
        )
    ]


# ---- the environment class and the tools --------------------------------------------


def _code_problem(key: str, value: Any, exc: TaskDataError) -> Problem:
    cause = exc.__cause__
    reason = str(cause) if isinstance(cause, TargetError) else str(exc)
    role = key_role(key)
    if isinstance(cause, NotMarkedError):
        remedy = fix(
            note=f"mark it @{role} (from art_hydra import {role}), or {key}={value} on the "
            "command line"
        )
    else:
        shape = "module.Class" if role == "environment" else "module.function"
        remedy = fix({key: placeholder(shape)})
    return world_problem(key, value, reason, remedy)


def _bounded(cfg: DictConfig, work: Callable[[], Any]) -> Any:
    """``work()`` in a worker thread within ``timeouts.tool_s`` (its exception re-raised;
    TimeoutError when it does not return)."""
    from art_hydra import workers

    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    thread = workers.start(run, "preflight-env")
    thread.join(float(cfg.timeouts.tool_s))
    if thread.is_alive():
        raise TimeoutError(f"did not return within timeouts.tool_s={cfg.timeouts.tool_s:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _class_problems(cfg: DictConfig, agent: Agent) -> list[Problem]:
    """The environment class resolves, has a callable ``reset`` and can be made."""
    path = environment_path(cfg.task)
    if path is None:
        return []  # no environment, or none named (composition refuses that)
    try:
        found = resolve_task_code(cfg.task, ENVIRONMENT_KEY)
    except TaskDataError as exc:
        return [_code_problem(ENVIRONMENT_KEY, path, exc)]
    if not callable(getattr(found, "reset", None)):
        return [
            world_problem(
                ENVIRONMENT_KEY,
                path,
                f"the class {found.__qualname__} has no reset method: the run calls "
                "reset(**row) on each rollout's environment before the first turn.",
                fix(note="define reset(self, **kwargs) -> str | None in the class"),
            )
        ]
    agent.env_class = found
    kwargs = environment_kwargs(cfg.task)
    try:
        _bounded(cfg, lambda: found(**kwargs))
    except Exception as exc:
        shown = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
        return [
            world_problem(
                ENVIRONMENT_KEY,
                path,
                f"is made as {found.__qualname__}({shown}) (the entry's other keys) once per "
                f"rollout, and its constructor raised {raised(exc)}.",
                fix(note="fix the constructor, or the keys task.environment gives it"),
            )
        ]
    agent.made = True
    return []


def _tools(cfg: DictConfig, agent: Agent) -> Iterator[tuple[str, str, str, Any]]:
    """``(key, value, name, function)`` of every tool; a tool that does not resolve is
    yielded with its problem as the function."""
    if agent.env_class is not None:
        path = environment_path(cfg.task)
        for name in environment_methods(agent.env_class):
            yield ENVIRONMENT_KEY, f"{path}.{name}", name, getattr(agent.env_class, name)
    for key in tool_keys(cfg.task):
        value = cfg.task.tools[int(key.rpartition(".")[2])]
        try:
            fn = resolve_task_code(cfg.task, key)
        except TaskDataError as exc:
            yield key, value, "", _code_problem(key, value, exc)
            continue
        yield key, value, fn.__name__, fn


def _tool_problems(cfg: DictConfig, agent: Agent) -> list[Problem]:
    """Each tool yields a schema (its docstring described, its arguments typed); two
    tools of one name are an error."""
    problems: list[Problem] = []
    owners: dict[str, str] = {}
    for key, value, name, fn in _tools(cfg, agent):
        if isinstance(fn, Problem):
            problems.append(fn)
            continue
        try:
            schema = tool_schema(fn, name)
        except ToolSchemaError as exc:
            problems.append(
                world_problem(
                    key,
                    value,
                    f"the tool {name} cannot be shown to the model: {exc}.",
                    fix(
                        note=f"give {name} a docstring (its description, then an Args: line "
                        "per parameter) and a type hint on each parameter"
                    ),
                )
            )
            continue
        if name in owners:
            problems.append(
                world_problem(
                    key,
                    value,
                    f"is a tool named {name!r}, as {owners[name]} is: the model calls a tool by "
                    "its name, so two tools cannot share one.",
                    fix(note=f"rename one of the two, or drop {key}"),
                )
            )
            continue
        owners[name] = value
        agent.schemas[name] = schema
        if missing := undescribed_arguments(schema):
            problems.append(
                world_problem(
                    key,
                    value,
                    f"the tool {name}'s docstring does not describe {', '.join(missing)}: "
                    "the model is shown the argument without saying what it is for.",
                    fix(note=f"describe each under Args: in {name}'s docstring"),
                    warning=True,
                )
            )
    return problems


# ---- reset on the first rows --------------------------------------------------------


def _reset_problems(
    cfg: DictConfig, agent: Agent, rows: Sequence[tuple[str, Example]]
) -> list[Problem]:
    """``reset`` on each of the first rows, each on a fresh instance."""
    assert agent.env_class is not None
    path, kwargs = environment_path(cfg.task), environment_kwargs(cfg.task)
    for where, example in rows:
        row = reset_row(example)

        def work(row: dict[str, Any] = row) -> Any:
            env = agent.env_class(**kwargs)  # type: ignore[misc]
            return env.reset(**reset_arguments(env.reset, row))

        try:
            found = _bounded(cfg, work)
        except Exception as exc:
            reason = f"reset raised {raised(exc)} on the row {where}"
            remedy = fix(note="fix reset for such rows, or the row")
            return [world_problem(ENVIRONMENT_KEY, path, f"{reason}.", remedy)]
        if found is not None and not isinstance(found, str):
            return [
                world_problem(
                    ENVIRONMENT_KEY,
                    path,
                    f"reset returned a {type(found).__name__} on the row {where}: it returns "
                    "text appended to the prompt's last user message, or None (TRL's rule).",
                    fix(note="return a str or None from reset"),
                )
            ]
    return []


# ---- the chat template and the budgets -----------------------------------------------


def _chat_template_problems(cfg: DictConfig) -> list[Problem]:
    value = cfg.model.get("chat_template")
    why = template_refusal(value)
    if why is None:
        return []
    from art_hydra.templates import shipped_names

    return [
        world_problem(
            "model.chat_template",
            value,
            f"{why}.",
            fix(
                {"model.chat_template": placeholder("a .jinja file")},
                f"shipped: {', '.join(shipped_names())}",
                alt=fix({"model.chat_template": None}, "the tokenizer's own"),
            ),
        )
    ]


class TinyRenderer:
    """The tiny model's character tokenizer with ``model.chat_template``: rendered in the
    folder tokenizer's sandbox, one token per character (a special token's text one)."""

    def __init__(self, template: str) -> None:
        self.template = template

    def render(self, messages: Sequence[dict[str, Any]], tools: Any, gen: bool) -> str:
        from art_hydra.folder_tokenizer import render_bounded

        variables = dict(
            messages=list(messages),
            tools=tools,
            documents=None,
            add_generation_prompt=gen,
            **_TINY_SPECIALS,
        )
        return render_bounded(self.template, variables, "model.chat_template")

    def encode(self, text: str) -> list[int]:
        from art_hydra.preflight.lengths import TinyCounter

        return [0] * TinyCounter()._count(text)[0]


class FolderRenderer:
    """A model folder's tokenizer with a template (``model.chat_template`` or its own)."""

    def __init__(self, tokenizer: Any, template: str) -> None:
        self.tokenizer = tokenizer
        self.template = template

    def render(self, messages: Sequence[dict[str, Any]], tools: Any, gen: bool) -> str:
        return str(self.tokenizer.render_chat(messages, tools, gen, self.template))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))


def renderer_for(cfg: DictConfig) -> tuple[Any, str | None]:
    """The run's chat renderer (None: no template, or the folder is not readable here) and,
    for None, why there is no template (None: the model pre-flight says why)."""
    from art_hydra.templates import load_chat_template

    chosen = cfg.model.get("chat_template")
    template = load_chat_template(str(chosen)) if chosen else None
    if cfg.model.source == ModelSource.tiny:
        if template is None:
            return None, "the tiny model's character tokenizer has no chat template"
        return TinyRenderer(template), None
    from art_hydra.preflight.common import model_folder
    from art_hydra.preflight.lengths import load_tokenizer

    folder = model_folder(cfg.model)
    tokenizer = None if folder is None else load_tokenizer(folder)
    if tokenizer is None:
        return None, None
    template = template or tokenizer.chat_template
    if not template:
        return None, f"the tokenizer of model.name={cfg.model.name} has no chat template"
    return FolderRenderer(tokenizer, template), None


def _template_problems(cfg: DictConfig, agent: Agent, rows: Rows) -> list[Problem]:
    """The template renders tool turns, keeps earlier ones, and the budgets hold."""
    renderer, missing = renderer_for(cfg)
    if renderer is None:
        if missing is None:
            return []
        return [
            world_problem(
                "model.chat_template",
                cfg.model.get("chat_template"),
                f"{missing}, and tool calls and tool results are rendered by one.",
                fix({"model.chat_template": "tools" if _tiny(cfg) else placeholder(".jinja")}),
            )
        ]
    schemas = list(agent.schemas.values()) or None
    problems = [_finding_problem(cfg, f, rows) for f in tpl.check_template(renderer, schemas)]
    problems = [p for p in problems if p is not None]
    if any(p.is_error for p in problems):
        return problems
    return problems + _budget_problems(cfg, renderer, schemas, rows)


def _tiny(cfg: DictConfig) -> bool:
    return cfg.model.source == ModelSource.tiny


_WHY = {
    tpl.NO_TOOLS: "it cannot render a prompt with the tools' schemas",
    tpl.NO_CALLS: "it does not render an assistant turn's tool calls",
    tpl.NO_RESULTS: "it does not render tool results (role 'tool' messages)",
    tpl.NO_SUFFIX: "the text tool results add after a turn cannot be found",
}


def _finding_problem(cfg: DictConfig, finding: tpl.Finding, rows: Rows) -> Problem | None:
    """One finding of :func:`~art_hydra.engine.envs.template.check_template` as a problem."""
    value = cfg.model.get("chat_template") or cfg.model.name
    training = fix(
        {"model.chat_template": placeholder("a training template that keeps earlier turns")},
        "TRL's chat_template_path",
    )
    if finding.kind != tpl.EARLIER_CHANGED:
        return world_problem(
            "model.chat_template",
            value,
            f"the chat template cannot hold a tool conversation: {_WHY[finding.kind]} "
            f"({finding.message}).",
            fix(
                {"model.chat_template": "tools" if _tiny(cfg) else placeholder(".jinja")},
                "a template that renders tool calls and tool messages",
            ),
        )
    if cfg.algorithm.name == AlgorithmName.sft:
        if rows.multi_turn is None:
            return None
        return world_problem(
            "model.chat_template",
            value,
            f"the chat template changes earlier turns as later ones are appended "
            f"({finding.message}), so the multi-turn conversations of the data "
            f"({rows.multi_turn}) cannot be cut into turns as a rollout samples them.",
            training,
        )
    return world_problem(
        "model.chat_template",
        value,
        f"the chat template changes earlier turns as later ones are appended "
        f"({finding.message}): training stays token-exact (each turn's ids are kept as "
        "sampled), but the context the model trains on differs from what the template "
        "serves at inference.",
        training,
        warning=True,
    )


def _budget_problems(
    cfg: DictConfig, renderer: Any, schemas: list[dict[str, Any]] | None, rows: Rows
) -> list[Problem]:
    """Prompts with the tools' schemas, one tool suffix and rl.max_tool_calls suffixes,
    against their budgets (RL: SFT samples nothing)."""
    if cfg.algorithm.name != AlgorithmName.rl:
        return []
    from art_hydra.config.validators import budget_fix

    problems = []
    longest, where = 0, ""
    for row_where, example in rows.sampled:
        size = len(renderer.encode(renderer.render(_prompt(example, cfg), schemas, True)))
        if size > longest:
            longest, where = size, row_where
    if longest > cfg.rl.max_prompt_length:
        problems.append(
            world_problem(
                "rl.max_prompt_length",
                cfg.rl.max_prompt_length,
                f"the longest prompt rendered with the tools' schemas ({where}) takes "
                f"{longest} tokens, more than rl.max_prompt_length={cfg.rl.max_prompt_length}: "
                "it cannot be sampled from without cutting it.",
                budget_fix(cfg, "rl.max_prompt_length", longest),
            )
        )
    return problems + _suffix_problems(cfg, renderer, schemas)


def _prompt(example: Example, cfg: DictConfig) -> list[dict[str, Any]]:
    from art_hydra.tasks.base import with_system_prompt

    example = with_system_prompt(example, cfg.task.get("system_prompt"))
    pairs = example.messages or (("user", example.prompt),)
    return [{"role": r, "content": c} for r, c in pairs]


def suffix_tokens(renderer: Any, schemas: list[dict[str, Any]] | None) -> int:
    """The tokens the run appends after a sampled turn for one (short probe) tool result:
    what the template writes after the turn's end token (which was sampled, so its one
    token is not counted), then the tool message and the next generation prompt (see
    :class:`~art_hydra.engine.envs.template.ToolSuffix`)."""
    end = tpl.turn_end(renderer, schemas)
    _, after = tpl.suffix_text(renderer, [tpl.tool_message(tpl.RESULT)], schemas)
    return max(len(renderer.encode(end)) - 1, 0) + len(renderer.encode(after))


def _suffix_problems(
    cfg: DictConfig, renderer: Any, schemas: list[dict[str, Any]] | None
) -> list[Problem]:
    """One tool suffix (+ a sampled token and the end of turn) fits the completion budget;
    rl.max_tool_calls of them fit it."""
    from art_hydra.config.validators import budget_fix

    suffix = suffix_tokens(renderer, schemas)
    budget = cfg.rl.max_completion_length
    if suffix + 2 > budget:
        return [
            world_problem(
                "rl.max_completion_length",
                budget,
                f"one tool result takes {suffix} tokens of template text (a short probe "
                "result), and a completion must also hold the call and an answer: no tool "
                "call could ever be answered.",
                budget_fix(cfg, "rl.max_completion_length", 4 * (suffix + 1)),
            )
        ]
    fits, needed = budget // (suffix + 1), cfg.rl.max_tool_calls * (suffix + 1)
    if needed <= budget:
        return []
    return [
        world_problem(
            "rl.max_tool_calls",
            cfg.rl.max_tool_calls,
            f"each tool call adds at least {suffix + 1} tokens (a sampled token and {suffix} "
            f"of tool result), so rl.max_completion_length={budget} holds at most {fits} "
            "calls: the length budget ends trajectories first.",
            fix(
                {"rl.max_tool_calls": max(fits, 1)},
                alt=budget_fix(
                    cfg, "rl.max_completion_length", cfg.rl.max_tool_calls * (suffix + 1)
                ),
            ),
            warning=True,
        )
    ]
