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

All active trajectories sample each turn as one request each, with no more tokens than
the trajectory has left (rounded down to a few distinct budgets, so the torch sampler
batches them; a turn the rounding stopped short is continued by the next request).
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
from art_hydra.errors import StallError


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
    #: Where the turn being sampled begins in ``ids`` (a turn may take several requests).
    turn_start: int = 0

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
    sample: Callable[[Any, list[Request], float | None], list[Any]],
    timeout_s: float | None = None,
) -> list[Trajectory]:
    """Roll every trajectory out to its end; ``sample(engine, requests, timeout_s)``
    calls the engine (the caller's settings and generator bound into it). ``timeout_s``
    bounds the whole batch, every turn and tool call included (``timeouts.rollout_s``):
    each request gets what is left of it."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        active = [t for t in trajectories if not t.done]
        if not active:
            return trajectories
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise StallError(
                f"the multi-turn rollouts of a generation batch did not finish within "
                f"{timeout_s:g}s (timeouts.rollout_s, tool calls included): "
                f"{sum(t.turns for t in trajectories)} turns and "
                f"{sum(t.tool_calls for t in trajectories)} tool calls so far, "
                f"{len(active)} of {len(trajectories)} trajectories unfinished"
            )
        requests = [
            Request(
                tuple(t.prompt_ids + t.ids),
                room(rules.budget - len(t.ids), rules.budget),
                rules.stop_ids,
            )
            for t in active
        ]
        for trajectory, completion in zip(active, sample(engine, requests, left), strict=True):
            _take_turn(trajectory, completion.token_ids, completion.logprobs, rules)


def room(left: int, budget: int) -> int:
    """The tokens one request may sample: what the trajectory has left, rounded down to a
    multiple of an eighth of the budget (so the torch sampler, which batches requests of
    one budget together, makes a few batches, not one per trajectory). Never more than
    is left, so no sequence outgrows prompt + budget (the model's positions); a turn the
    rounding stops short is continued by the next request."""
    step = max(1, budget // 8)
    return max(left // step * step, min(left, step))


def _take_turn(t: Trajectory, ids: list[int], logprobs: list[float], rules: TurnRules) -> None:
    """Append what one request sampled; a turn that ended (a stop id, or the budget)
    is read for tool calls and, where they run and room is left, their results follow."""
    ids, logprobs = ids[: rules.budget - len(t.ids)], logprobs[: rules.budget - len(t.ids)]
    t.ids += ids
    t.mask += [1] * len(ids)
    t.logprobs += [float(v) for v in logprobs]
    stopped = bool(ids) and ids[-1] in rules.stop_ids
    if not stopped and len(t.ids) < rules.budget:
        return  # the request's room ran out, not the turn: the next request continues it
    t.turns += 1
    turn_ids = t.ids[t.turn_start : len(t.ids) - 1 if stopped else len(t.ids)]
    turn = rules.parse(rules.decode(turn_ids))
    message: dict[str, Any] = {"role": "assistant", "content": turn.content}
    t.messages.append(message)
    if not stopped:  # cut by the budget: a call it may hold was never finished
        t.finish_reason, t.done = LENGTH, True
        return
    calls = list(turn.tool_calls)[: max(rules.max_tool_calls - t.tool_calls, 0)]
    if not calls:
        t.done = True
        return
    message["tool_calls"] = [c.openai() for c in calls]
    message["_calls"] = calls
    results = [_result(t, call, rules.tool_timeout_s) for call in calls]
    suffix = rules.suffix.ids(t.ids[-1], results)
    if len(t.ids) + len(suffix) >= rules.budget:  # no room for a token of the next turn
        t.finish_reason, t.done = LENGTH, True  # (the results are not in the trained ids)
        return
    t.messages += results
    t.ids += suffix
    t.mask += [0] * len(suffix)
    t.logprobs += [0.0] * len(suffix)
    t.turn_start = len(t.ids)


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
