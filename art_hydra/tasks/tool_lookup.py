"""The tool-use demo (``experiment=tool_use``): the answer is a value stored under a key,
and only the ``lookup`` tool knows it, so the reward needs a tool call.

The prompt is a key (two letters); the answer is the two-digit value the table holds for
it, which no prompt contains. :class:`LookupEnv` is an environment in TRL's
``environment_factory`` shape (``reset(**row)``, a public method with a docstring as its
tool); :func:`lookup` is the same tool as a plain function (``task.tools``). The
generator yields demonstrations too (a conversation that calls the tool, then answers)
for the SFT warm start that teaches the tiny model the call's format.
"""

from __future__ import annotations

import random
import string
import zlib
from collections.abc import Iterator
from typing import Any

from art_hydra.tasks.examples import Example
from art_hydra.tasks.markers import environment, generator, tool


def value_of(key: str) -> str:
    """The value stored under ``key``: two digits, fixed by the key alone."""
    return f"{zlib.crc32(key.encode()) % 100:02d}"


@tool
def lookup(key: str) -> str:
    """Look up the value stored under a key.

    Args:
        key: The key, as the question gives it.
    """
    return value_of(key.strip())


@environment
class LookupEnv:
    """One rollout's view of the table: ``lookup`` answers from it, and counts calls."""

    def __init__(self) -> None:
        self.calls = 0

    def reset(self, **row: Any) -> None:
        self.calls = 0

    def lookup(self, key: str) -> str:
        """Look up the value stored under a key.

        Args:
            key: The key, as the question gives it.
        """
        self.calls += 1
        return value_of(key.strip())


def demonstration(key: str, guess: str | None = None) -> tuple[dict[str, Any], ...]:
    """A conversation to imitate: call the tool with the key, then answer its result; or,
    with ``guess``, answer ``guess`` straight away, without the tool."""
    if guess is not None:
        return ({"role": "user", "content": key}, {"role": "assistant", "content": guess})
    call = {"type": "function", "function": {"name": "lookup", "arguments": {"key": key}}}
    return (
        {"role": "user", "content": key},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "name": "lookup", "content": value_of(key)},
        {"role": "assistant", "content": value_of(key)},
    )


@generator
def lookup_examples(
    rng: random.Random, num_examples: int, tool_share: float = 1.0
) -> Iterator[Example]:
    """Keys of two lowercase letters, each with its value as the answer and a
    demonstration for the warm start: a share ``tool_share`` of them calls the tool, the
    rest guess a value (an agent that has not yet learned what its tool is for)."""
    letters = string.ascii_lowercase
    for _ in range(num_examples):
        key = rng.choice(letters) + rng.choice(letters)
        guess = None if rng.random() < tool_share else f"{rng.randrange(100):02d}"
        yield Example(prompt=key, answer=value_of(key), conversation=demonstration(key, guess))
