"""Toy tasks whose answers depend on the prompt, so a model must read it to score."""

from __future__ import annotations

import random
from collections.abc import Iterator

from art_hydra.tasks.examples import Example
from art_hydra.tasks.markers import generator


@generator
def reverse_examples(
    rng: random.Random, num_examples: int, length: int = 3, alphabet: str = "abcdefgh"
) -> Iterator[Example]:
    """``"abc="`` -> ``"cba"``: reverse a short string."""
    for _ in range(num_examples):
        word = "".join(rng.choice(alphabet) for _ in range(length))
        yield Example(prompt=f"{word}=", answer=word[::-1])


@generator
def digit_sum_examples(rng: random.Random, num_examples: int) -> Iterator[Example]:
    """``"3+4="`` -> ``"7"``: add two single digits."""
    for _ in range(num_examples):
        a, b = rng.randrange(10), rng.randrange(10)
        yield Example(prompt=f"{a}+{b}=", answer=str(a + b))
