"""Tools: plain functions (``task.tools``) and an environment's public methods, each with
the JSON schema the chat template shows the model, called bounded in time.

The schema is read the way transformers' ``get_json_schema`` (which TRL uses) reads it:
the docstring's text before ``Args:`` is the description, each ``name: text`` line under
``Args:`` describes a parameter, and the type hints give the types. It is written here
in a few lines so the pre-flight can check tools without importing transformers.
"""

from __future__ import annotations

import inspect
import json
import re
import time
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from art_hydra import workers
from art_hydra.errors import StallError, raised

#: Methods of an environment that are never tools (TRL's rule: every other public
#: method is one).
NOT_TOOLS = frozenset({"reset", "get_reward", "close"})
#: Characters of a tool's result fed back to the model (a tool returning a whole file
#: would overflow the completion budget at once).
RESULT_MAX_CHARS = 16_384

_JSON_TYPES: dict[Any, str] = {
    int: "integer",
    float: "number",
    str: "string",
    bool: "boolean",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")


class ToolSchemaError(ValueError):
    """A function whose schema cannot be made (no docstring, a parameter without a type
    hint or of a type JSON has no name for)."""


@dataclass(frozen=True)
class Tool:
    """A callable the model may call by ``name``, and the schema it is shown."""

    name: str
    fn: Callable[..., Any]
    schema: dict[str, Any]


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is typing.Literal:
        return {"enum": list(typing.get_args(hint))}
    if origin in (typing.Union, types.UnionType):
        found = [_json_type(a, where) for a in typing.get_args(hint)]
        names = [f["type"] for f in found if "type" in f]
        return {"type": names if len(names) > 1 else names[0]} if names else found[0]
    if origin in (list, tuple, set, frozenset):
        args = [a for a in typing.get_args(hint) if a is not Ellipsis]
        out: dict[str, Any] = {"type": "array"}
        if len(args) == 1:
            out["items"] = _json_type(args[0], where)
        return out
    if origin in (dict, Mapping) or hint is Any:
        return {"type": "object"} if hint is not Any else {}
    raise ToolSchemaError(f"{where} has the type {hint!r}, which JSON has no type for")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before ``Args:``) and each argument's text."""
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    args: dict[str, str] = {}
    section = "description"
    current: str | None = None
    for line in lines:
        head = line.strip().lower().rstrip(":")
        if line.strip().endswith(":") and head in {"args", "arguments", "parameters"}:
            section = "args"
            continue
        if line.strip().endswith(":") and head in {"returns", "raises", "yields", "examples"}:
            section = "other"
            continue
        if section == "description":
            description.append(line.strip())
        elif section == "args":
            match = _ARG_LINE.match(line)
            if match and (line.startswith(" ") or line.startswith("\t") or not current):
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current and line.strip():
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(p for p in description if p).strip(), args


def tool_schema(fn: Callable[..., Any], name: str | None = None) -> dict[str, Any]:
    """The OpenAI-style function schema of ``fn`` (``{"type": "function", "function":
    {...}}``), or :class:`ToolSchemaError` saying what the function lacks."""
    label = name or getattr(fn, "__name__", repr(fn))
    doc = inspect.getdoc(fn)
    if not doc or not doc.strip():
        raise ToolSchemaError(
            f"{label} has no docstring: the model is shown a tool's docstring as its "
            "description (with an Args: section for its parameters), so every tool needs one"
        )
    description, arg_text = _docstring_parts(doc)
    try:
        signature = inspect.signature(fn)
        hints = typing.get_type_hints(fn)
    except (TypeError, ValueError, NameError) as exc:
        raise ToolSchemaError(f"{label}'s signature cannot be read ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in signature.parameters.values():
        if param.name == "self":
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolSchemaError(
                f"{label} takes {param}: a tool is called with its arguments by name, so "
                "each must be a named parameter with a type hint"
            )
        if param.name not in hints:
            raise ToolSchemaError(
                f"{label}'s parameter {param.name!r} has no type hint, so the model cannot "
                "be told what to pass"
            )
        prop = _json_type(hints[param.name], f"{label}'s parameter {param.name!r}")
        if param.name in arg_text:
            prop["description"] = arg_text[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return {
        "type": "function",
        "function": {"name": label, "description": description, "parameters": parameters},
    }


def undescribed_arguments(schema: dict[str, Any]) -> list[str]:
    """Parameters of a tool's schema that its docstring does not describe."""
    props = schema["function"]["parameters"]["properties"]
    return [name for name, prop in props.items() if "description" not in prop]


def environment_methods(env_class: type) -> list[str]:
    """The names of the public methods of an environment class that are its tools
    (TRL's rule: every public method but ``reset``; ``get_reward`` gives the reward).
    Only methods of the class's own package count: a library base class's public
    methods (``gymnasium.Env.step``, ``render``) are not tools the user wrote."""
    own = env_class.__module__.partition(".")[0]
    names = []
    for name, member in inspect.getmembers(env_class):
        if name.startswith("_") or name in NOT_TOOLS:
            continue
        if not (inspect.isfunction(member) or inspect.ismethod(member)):
            continue
        owner = next((c for c in env_class.__mro__ if name in vars(c)), env_class)
        if owner.__module__.partition(".")[0] == own:
            names.append(name)
    return names


def environment_tools(env: Any) -> list[Tool]:
    """The tools of one environment instance: its public methods, bound to it."""
    return [
        Tool(name, getattr(env, name), tool_schema(getattr(env, name), name))
        for name in environment_methods(type(env))
    ]


def function_tools(functions: list[Callable[..., Any]]) -> list[Tool]:
    """``task.tools``: plain functions, each its own tool under its ``__name__``."""
    return [Tool(fn.__name__, fn, tool_schema(fn, fn.__name__)) for fn in functions]


@dataclass
class ToolResult:
    """What a call gave the model (its message), whether it failed, and how long it took."""

    content: str
    error: bool
    seconds: float


class ToolTimeout(StallError):
    """A tool that did not return within ``timeouts.tool_s``: its thread cannot be
    stopped, so the run stops, naming the tool and the call."""


def as_text(value: Any) -> str:
    """A tool's return value as the tool message's content: text as it is, anything JSON
    can hold as JSON, else ``str``; cut at :data:`RESULT_MAX_CHARS`."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (TypeError, ValueError):
            text = str(value)
    return text if len(text) <= RESULT_MAX_CHARS else text[:RESULT_MAX_CHARS] + "...[cut]"


def call_tool(tools: Mapping[str, Tool], name: str, arguments: Any, timeout_s: float) -> ToolResult:
    """Call the tool ``name`` with ``arguments`` (a dict), in a worker thread bounded by
    ``timeout_s``. An unknown name, arguments it does not take, or an exception it
    raises are fed back to the model as the tool message (as TRL does); only a tool
    that never returns stops the run (:class:`ToolTimeout`)."""
    start = time.perf_counter()
    tool = tools.get(name)
    if tool is None:
        known = ", ".join(sorted(tools)) or "none"
        return ToolResult(f"error: no tool named {name!r} (tools: {known})", True, 0.0)
    if not isinstance(arguments, dict):
        return ToolResult(f"error: the arguments of {name} must be a JSON object", True, 0.0)
    try:
        inspect.signature(tool.fn).bind(**arguments)
    except TypeError as exc:
        return ToolResult(f"error: {name}: {exc}", True, 0.0)
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["text"] = as_text(tool.fn(**arguments))
        except BaseException as exc:  # fed back to the model, as TRL does
            try:
                box["error"] = f"error: {raised(exc)}"
            except BaseException:
                box["error"] = f"error: {type(exc).__name__}"

    thread = workers.start(work, "tool")
    thread.join(timeout_s)
    seconds = time.perf_counter() - start
    if thread.is_alive():
        shown = json.dumps(arguments, ensure_ascii=False, default=str)[:200]
        raise ToolTimeout(
            f"the tool {name}({shown}) did not return within {timeout_s:g}s "
            "(timeouts.tool_s); raise timeouts.tool_s or make the tool return sooner"
        )
    if "error" in box:
        return ToolResult(box["error"], True, seconds)
    return ToolResult(box.get("text", ""), False, seconds)
