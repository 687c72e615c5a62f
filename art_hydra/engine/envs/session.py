"""A run's agent: its environment class and tool functions (resolved once), and, per
generation batch, one environment per rollout, reset on its row, with the prompt the
model sees (the chat template over the row's messages, with the tools' schemas).

TRL's ``environment_factory`` shape, unchanged: the class is instantiated with the
entry's other keys (TRL calls the factory with none), ``reset(**row)`` gets the row's
columns (those it accepts, all of them with ``**kwargs``) and may return text that is
appended to the last user message; its public methods are the tools; rewards get the
environments as ``environments=`` (batched) or ``environment=`` (per sample); a
``get_reward()`` is one more reward, ``environment``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from art_hydra.engine.envs.parsers import turn_parser
from art_hydra.engine.envs.template import HFRenderer, ToolSuffix
from art_hydra.engine.envs.tools import Tool, environment_tools, function_tools, tool_schema
from art_hydra.errors import raised
from art_hydra.tasks.agent_code import reset_arguments, reset_row
from art_hydra.tasks.examples import Example, TaskDataError

log = logging.getLogger(__name__)

#: Encoded prompts kept at most (an environment whose reset() text differs every
#: rollout would otherwise grow the cache for the whole run).
PROMPT_CACHE = 8192
#: The reward a ``get_reward()`` method stands for, by its metric name.
ENV_REWARD = "environment"


@dataclass
class Rollout:
    """One rollout's environment (None: tools only), its tools and its prompt."""

    environment: Any
    tools: dict[str, Tool]
    messages: list[dict[str, Any]]


class Agent:
    """The run's environment class and tools, and the template machinery to continue
    a trajectory (built once, when the model and tokenizer are loaded)."""

    def __init__(
        self,
        env_class: type | None,
        env_kwargs: dict[str, Any],
        functions: list[Callable[..., Any]],
        tokenizer: Any,
        parser: str,
    ) -> None:
        self.env_class = env_class
        self.env_kwargs = dict(env_kwargs)
        self.functions = function_tools(functions)
        self.tokenizer = tokenizer
        self.renderer = HFRenderer(tokenizer)
        self.schemas = tool_schemas(env_class, self.functions)
        self.parse = turn_parser(parser, tokenizer)
        stops = {i: tokenizer.convert_ids_to_tokens(i) for i in _special_ids(tokenizer)}
        self.suffix = ToolSuffix(self.renderer, self.schemas or None, stops)
        self.has_reward = env_class is not None and callable(getattr(env_class, "get_reward", None))
        self._prompts: dict[str, list[int]] = {}

    def start(self, example: Example) -> Rollout:
        """A new rollout of ``example``: its environment made and reset, its prompt."""
        messages = [
            {"role": r, "content": c} for r, c in (example.messages or (("user", example.prompt),))
        ]
        tools = {t.name: t for t in self.functions}
        env = None
        if self.env_class is not None:
            env = self._make()
            observation = self._reset(env, example)
            if observation:
                messages[-1] = {**messages[-1], "content": messages[-1]["content"] + observation}
            tools.update({t.name: t for t in environment_tools(env)})
        return Rollout(env, tools, messages)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """The prompt's ids: the template with the tools' schemas and the generation
        prompt (cached: most rollouts of a group see the same prompt)."""
        key = repr(messages)
        if key not in self._prompts:
            if len(self._prompts) >= PROMPT_CACHE:  # observations that differ every rollout
                self._prompts.clear()
            ids = self.tokenizer.apply_chat_template(
                messages, tools=self.schemas or None, add_generation_prompt=True, tokenize=True
            )
            self._prompts[key] = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
        return self._prompts[key]

    def _make(self) -> Any:
        assert self.env_class is not None
        try:
            return self.env_class(**self.env_kwargs)
        except Exception as exc:
            raise TaskDataError(
                f"task.environment._target_: making {self.env_class.__qualname__}"
                f"(**{self.env_kwargs}) raised {raised(exc)}"
            ) from exc

    def _reset(self, env: Any, example: Example) -> str | None:
        try:
            found = env.reset(**reset_arguments(env.reset, reset_row(example)))
        except Exception as exc:
            raise TaskDataError(
                f"task.environment: reset() raised {raised(exc)} on the row whose prompt is "
                f"{example.prompt[:60]!r}"
            ) from exc
        if found is not None and not isinstance(found, str):
            raise TaskDataError(
                f"task.environment: reset() returned a {type(found).__name__}; it must "
                "return text (appended to the prompt) or None"
            )
        return found


def tool_schemas(env_class: type | None, functions: list[Tool]) -> list[dict[str, Any]]:
    """Every tool's schema, as the template shows them: ``task.tools`` first, then the
    environment class's methods (the same for every instance)."""
    from art_hydra.engine.envs.tools import environment_methods

    methods = [] if env_class is None else environment_methods(env_class)
    return [t.schema for t in functions] + [tool_schema(getattr(env_class, n), n) for n in methods]


def _special_ids(tokenizer: Any) -> set[int]:
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return ids


def environment_reward(environments: list[Any], **_: Any) -> list[float | None]:
    """``get_reward()`` of each rollout's environment (batched, as TRL calls rewards)."""
    return [env.get_reward() for env in environments]


@dataclass
class AgentBatch:
    """A generation batch of multi-turn rollouts, as the producer consumes it."""

    prompts: list[list[int]]
    completions: list[list[int]]
    logprobs: list[list[float]]
    masks: list[list[int]]
    #: The final assistant turn of each (what text rewards score).
    texts: list[str]
    #: What batched rewards get besides the usual (TRL's ``environments`` and
    #: conversational ``completions``).
    reward_args: dict[str, list[Any]]
    #: The trajectories themselves (their tool calls, turns, masks, errors, tool time).
    trajectories: list[Any]
    #: Each trajectory as an OpenAI chat conversation (completions.jsonl).
    conversations: list[list[dict[str, Any]]]

    def info(self, start: int = 0, stop: int | None = None) -> dict[str, float]:
        """The agent metrics of trajectories ``start:stop`` (one optimizer step's)."""
        from art_hydra.engine.envs.loop import agent_metrics

        return agent_metrics(self.trajectories[start:stop])

    def close(self) -> None:
        """Close each environment that has a ``close()`` (after scoring: rewards read
        them); one that raises is logged, not fatal."""
        for env in self.reward_args.get("environments", ()):
            closer = getattr(env, "close", None)
            if callable(closer):
                try:
                    closer()
                except Exception as exc:
                    log.warning("an environment's close() raised %s", raised(exc))


def agent_rollouts(
    agent: Agent,
    examples: list[Example],
    rules_for: Callable[[Agent], Any],
    sample: Callable[[Any, list[Any], float | None], list[Any]],
    engine: Any,
    timeout_s: float | None = None,
) -> AgentBatch:
    """Roll out every example (each repeated for its group already) as a multi-turn
    trajectory on ``engine``, each with its own environment."""
    from art_hydra.engine.envs.loop import Trajectory, record_messages, run_trajectories

    rules = rules_for(agent)
    rollouts = [agent.start(ex) for ex in examples]
    trajectories = [Trajectory(agent.prompt_ids(r.messages), r.tools) for r in rollouts]
    longest = max(len(t.prompt_ids) for t in trajectories)
    if rules.max_prompt is not None and longest > rules.max_prompt:
        raise TaskDataError(
            f"a prompt is {longest} tokens with the tools' schemas and what reset() added, "
            f"longer than rl.max_prompt_length={rules.max_prompt}; set "
            f"rl.max_prompt_length={longest} (and model.max_seq_length to fit)"
        )
    run_trajectories(engine, trajectories, rules, sample, timeout_s)
    reward_args: dict[str, list[Any]] = {
        "completions": [t.template_messages() for t in trajectories]
    }
    if agent.env_class is not None:
        reward_args["environments"] = [r.environment for r in rollouts]
    return AgentBatch(
        prompts=[t.prompt_ids for t in trajectories],
        completions=[t.ids for t in trajectories],
        logprobs=[t.logprobs for t in trajectories],
        masks=[t.mask for t in trajectories],
        texts=[t.final_text for t in trajectories],
        reward_args=reward_args,
        trajectories=trajectories,
        conversations=[
            record_messages(r.messages, t) for r, t in zip(rollouts, trajectories, strict=True)
        ],
    )
