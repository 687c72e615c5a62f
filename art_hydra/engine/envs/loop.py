"""The multi-turn rollout: sample an assistant turn, call the tools it asks for, append
their results, sample again; token-exact, on the rollout interface.

Every trajectory's completion is the ids the engine sampled and, between turns, the
*tool suffix* (:class:`~art_hydra.engine.envs.template.ToolSuffix`): the template's text
for the tool results and the next generation prompt, tokenized alone. Nothing the model
sampled is ever decoded and encoded again, so the trainer scores exactly the tokens the
sampler drew (TRL #5224, verl #3960). The completion's mask is 1 on sampled ids and 0 on
the suffixes, and is built beside the ids, so it always has the completion's length
(TRL #5144). A trajectory ends when a turn calls no tool, when ``rl.max_tool_calls``
calls were made, or when ``rl.max_completion_length`` runs out (a suffix that would not
leave room for a token of the next turn ends it too, unappended).

All active trajectories sample each turn as one batch, with one budget (the largest
left); a completion that ran past its own trajectory's budget is cut there, which is
the same draw its first tokens were.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from art_hydra.engine.envs.parsers import ParsedTurn
from art_hydra.engine.envs.template import ToolSuffix
from art_hydra.engine.envs.tools import Tool, call_tool
from art_hydra.engine.rollout.base import LENGTH, STOP, Request


@dataclass
class Trajectory:
    """One rollout's completion (everything after its prompt) and what happened in it."""

    prompt_ids: list[int]
    tools: dict[str, Tool]
    ids: list[int] = field(default_factory=list)
    #: 1 on sampled ids (they train), 0 on tool suffixes.
    mask: list[int] = field(default_factory=list)
    #: The sampler's logprob of each completion id (0.0 on suffix ids, never read).
    logprobs: list[float] = field(default_factory=list)
    #: The completion as OpenAI chat messages: assistant turns (with ``tool_calls``) and
    #: ``tool`` results.
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_seconds: float = 0.0
    turns: int = 0
    finish_reason: str = STOP
    done: bool = False

    @property
    def final_text(self) -> str:
        """The last assistant turn's content: what text rewards score."""
        for message in reversed(self.messages):
            if message["role"] == "assistant":
                return str(message.get("content") or "")
        return ""

    def template_messages(self) -> list[dict[str, Any]]:
        """The completion's messages as chat templates take them (arguments as dicts)."""
        out = []
        for message in self.messages:
            copy = {k: v for k, v in message.items() if k != "_calls"}
            if message.get("_calls"):
                copy["tool_calls"] = [c.template() for c in message["_calls"]]
            out.append(copy)
        return out


@dataclass(frozen=True)
class TurnRules:
    """What bounds a trajectory, and how its turns are read and continued."""

    budget: int
    max_tool_calls: int
    stop_ids: tuple[int, ...]
    tool_timeout_s: float
    parse: Callable[[str], ParsedTurn]
    decode: Callable[[list[int]], str]
    suffix: ToolSuffix
    #: The longest prompt (rl.max_prompt_length); None: not checked (evaluation).
    max_prompt: int | None = None

    @classmethod
    def of(
        cls, agent: Any, run: Any, budget: int, stop_ids: tuple[int, ...], max_prompt: int | None
    ) -> TurnRules:
        """The rules of ``agent``'s trajectories under the run's config ``run`` (its
        ``rl.max_tool_calls`` and ``timeouts.tool_s``), with ``budget`` tokens each."""
        tokenizer = agent.tokenizer
        return cls(
            budget=budget,
            max_tool_calls=run.rl.max_tool_calls,
            stop_ids=stop_ids,
            tool_timeout_s=run.timeouts.tool_s,
            parse=agent.parse,
            decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False),
            suffix=agent.suffix,
            max_prompt=max_prompt,
        )


def run_trajectories(
    engine: Any,
    trajectories: list[Trajectory],
    rules: TurnRules,
    sample: Callable[[Any, list[Request]], list[Any]],
) -> list[Trajectory]:
    """Roll every trajectory out to its end; ``sample(engine, requests)`` calls the
    engine (the caller's settings, generator and timeout bound into it)."""
    while True:
        active = [t for t in trajectories if not t.done]
        if not active:
            return trajectories
        room = max(rules.budget - len(t.ids) for t in active)
        requests = [Request(tuple(t.prompt_ids + t.ids), room, rules.stop_ids) for t in active]
        for trajectory, completion in zip(active, sample(engine, requests), strict=True):
            _take_turn(trajectory, completion.token_ids, completion.logprobs, rules)


def _take_turn(t: Trajectory, ids: list[int], logprobs: list[float], rules: TurnRules) -> None:
    """Append one sampled turn (cut to the trajectory's budget) and, where it calls
    tools and room is left, their results."""
    left = rules.budget - len(t.ids)
    cut = len(ids) > left
    ids, logprobs = ids[:left], logprobs[:left]
    t.ids += ids
    t.mask += [1] * len(ids)
    t.logprobs += [float(v) for v in logprobs]
    t.turns += 1
    stopped = bool(ids) and ids[-1] in rules.stop_ids and not cut
    text = rules.decode(ids[:-1] if stopped else ids)
    turn = rules.parse(text)
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    calls = list(turn.tool_calls)[: max(rules.max_tool_calls - t.tool_calls, 0)]
    if calls:
        message["tool_calls"] = [c.openai() for c in calls]
        message["_calls"] = calls
    t.messages.append(message)
    if not stopped:
        t.finish_reason, t.done = LENGTH, True
        return
    if not calls:
        t.done = True
        return
    results = [_result(t, call, rules.tool_timeout_s) for call in calls]
    suffix = rules.suffix.ids(ids[-1], results)
    t.messages += results
    if len(t.ids) + len(suffix) >= rules.budget:  # no room for a token of the next turn
        t.finish_reason, t.done = LENGTH, True
        return
    t.ids += suffix
    t.mask += [0] * len(suffix)
    t.logprobs += [0.0] * len(suffix)


def _result(t: Trajectory, call: Any, timeout_s: float) -> dict[str, Any]:
    """Call one parsed tool call and make its tool message (errors are the message)."""
    t.tool_calls += 1
    if call.error is not None:
        t.tool_errors += 1
        return {"role": "tool", "name": call.name or "unknown", "content": f"error: {call.error}"}
    start = time.perf_counter()
    result = call_tool(t.tools, call.name, call.arguments, timeout_s)
    t.tool_seconds += time.perf_counter() - start
    t.tool_errors += int(result.error)
    return {"role": "tool", "name": call.name, "content": result.content}


def agent_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    """The step's agent metrics: tool calls and turns per trajectory, the share of
    completion tokens masked (tool results and template text), tool errors and the
    seconds spent in tools."""
    n = max(len(trajectories), 1)
    tokens = sum(len(t.ids) for t in trajectories)
    masked = sum(len(t.mask) - sum(t.mask) for t in trajectories)
    return {
        "tool_calls_mean": sum(t.tool_calls for t in trajectories) / n,
        "turns_mean": sum(t.turns for t in trajectories) / n,
        "masked_token_share": masked / tokens if tokens else 0.0,
        "tool_errors": float(sum(t.tool_errors for t in trajectories)),
        "tool_time_s": sum(t.tool_seconds for t in trajectories),
    }


def record_messages(prompt: list[dict[str, Any]], t: Trajectory) -> list[dict[str, Any]]:
    """The trajectory as one conversation in the OpenAI chat shape (completions.jsonl)."""
    body = [{k: v for k, v in m.items() if k != "_calls"} for m in t.messages]
    return [*prompt, *body]
