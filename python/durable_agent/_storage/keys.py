"""Step keys: ``run:turn:call:attempt``, stable across a restart, escaped so any run id and call name fit.

In `run` and `call`, ``%`` is written ``%25`` and ``:`` is written ``%3A``; nothing else is
escaped, so every key has exactly one spelling and `parse_step_key` refuses any other
(``%3a``, ``%41``, a stray ``%``), keeping "same step" and "same key" the same thing.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from .._errors import StepKeyError

MODEL_CALL = "model"
"""The `call` of a turn's model request."""

_ESCAPE = re.compile(r"%(25|3A)")


class StepKeyParts(NamedTuple):
    """The four parts of a step key, unescaped."""

    run: str
    turn: int
    call: str
    attempt: int


def _escape(text: str) -> str:
    if "%" not in text and ":" not in text:  # most runs and calls: nothing to escape
        return text
    return text.replace("%", "%25").replace(":", "%3A")


def _unescape(text: str, what: str, key: str) -> str:
    plain = _ESCAPE.sub(lambda m: "%" if m.group(1) == "25" else ":", text)
    if _escape(plain) != text:
        raise StepKeyError(f"step key {key!r}: {what} has a malformed or non-canonical escape")
    return plain


def _bad_index(turn: object, attempt: object) -> StepKeyError:
    what, value = ("turn", turn) if type(turn) is not int or turn < 0 else ("attempt", attempt)
    return StepKeyError(f"step key {what} must be a non-negative int, got {value!r}")


class RunKeys:
    """The step keys of one run: its id checked and escaped once, not at every key (a loop makes a few a step)."""

    __slots__ = ("prefix",)

    def __init__(self, run: str) -> None:
        if not isinstance(run, str) or not run:
            raise StepKeyError("step key run must be a non-empty str")
        self.prefix = f"{_escape(run)}:"  # what every key of the run starts with, and no other run's key does

    def key(self, turn: int, call: str, attempt: int = 0) -> str:
        """The key of step `call` of turn `turn` (`step_key`)."""
        if not isinstance(call, str) or not call:
            raise StepKeyError("step key call must be a non-empty str")
        if type(turn) is not int or turn < 0 or type(attempt) is not int or attempt < 0:
            raise _bad_index(turn, attempt)
        return f"{self.prefix}{turn}:{_escape(call)}:{attempt}"


def step_key(run: str, turn: int, call: str, attempt: int = 0) -> str:
    """The escaped key of one step. Raises `StepKeyError` on an empty run or call, or a bad index."""
    return RunKeys(run).key(turn, call, attempt)


def run_key_prefix(run: str) -> str:
    """What every step key of `run` starts with (and no other run's key does: ':' is escaped in a run)."""
    return RunKeys(run).prefix


def parse_step_key(key: str) -> StepKeyParts:
    """Split a key built by `step_key`. Raises `StepKeyError` on anything else."""
    if not isinstance(key, str):
        raise StepKeyError(f"step key must be a str, got {type(key).__name__}")
    pieces = key.split(":")
    if len(pieces) != 4:
        raise StepKeyError(f"step key {key!r} must have four ':'-separated parts")
    run, turn, call, attempt = pieces
    numbers = []
    for text, what in ((turn, "turn"), (attempt, "attempt")):
        if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
            raise StepKeyError(f"step key {key!r}: {what} must be a non-negative integer without leading zeros")
        numbers.append(int(text))
    parts = StepKeyParts(_unescape(run, "run", key), numbers[0], _unescape(call, "call", key), numbers[1])
    if not parts.run or not parts.call:
        raise StepKeyError(f"step key {key!r}: run and call must not be empty")
    return parts


def nested_call(parent_call: str, n: int) -> str:
    """The `call` of the n-th call (from 1) made inside `parent_call`: ``<parent_call>/<n>``."""
    if not isinstance(parent_call, str) or not parent_call:
        raise StepKeyError("nested_call needs a non-empty parent call")
    if type(n) is not int or n < 1:
        raise StepKeyError(f"nested_call position must be an int of at least 1, got {n!r}")
    return f"{parent_call}/{n}"
