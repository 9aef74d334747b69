"""The reference checkpoint codec: JSON-compatible data (plus bytes) to compact JSON text and back.

This module is the specification the native codec must match byte for byte; the format
is written down in ``docs/codec.md``. In short:

* compact JSON (``,`` and ``:`` separators), keys in insertion order, non-ASCII written raw,
  floats as Python ``repr``; NaN and infinities are refused;
* ``bytes``/``bytearray``/``memoryview`` become ``{"$bytes": "<standard padded base64>"}``;
* a user dict whose only key is a reserved tag (``$bytes`` or ``$esc``) is written as
  ``{"$esc": {...}}`` and reads back as the same dict, so the codec is lossless;
* strings must be valid Unicode (a lone surrogate is refused: it cannot be stored as UTF-8);
* nesting deeper than ``MAX_DEPTH`` containers and integers of more than ``MAX_INT_DIGITS``
  decimal digits are refused, on both sides, so both sides agree on every input.

Decoding never executes or imports anything: it only ever builds dicts, lists, strings,
numbers, booleans, None and bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
from collections.abc import Callable
from typing import Any

from .errors import CodecError

BYTES_TAG = "$bytes"
ESCAPE_TAG = "$esc"
RESERVED_TAGS = frozenset({BYTES_TAG, ESCAPE_TAG})
MAX_DEPTH = 256
MAX_INT_DIGITS = 4300

_INT_LIMIT = 10**MAX_INT_DIGITS
_BIG_INT_BITS = 14_000  # below this many bits an int has fewer than MAX_INT_DIGITS digits
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")

_dumps = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False
).encode


class _EncodeFault(Exception):
    """An unencodable value; `path` grows (innermost first) as the fault unwinds out of containers."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.path: list[object] = []

    def as_codec_error(self) -> CodecError:
        steps = self.path[::-1]
        shown = "".join(f"[{p!r}]" for p in steps[-8:])
        return CodecError(f"{self.message} at ${'[...]' if len(steps) > 8 else ''}{shown}")


def _prepare(value: Any, depth: int) -> Any:
    """Validate `value` and rewrite it into plain JSON data (bytes tagged, reserved dicts escaped)."""
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if value.bit_length() > _BIG_INT_BITS and abs(value) >= _INT_LIMIT:
            raise _EncodeFault(f"integer with more than {MAX_INT_DIGITS} digits")
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _EncodeFault(f"{value!r} is not valid JSON (NaN and infinities are refused)")
        return value
    if depth > MAX_DEPTH:
        raise _EncodeFault(f"nesting deeper than {MAX_DEPTH}")
    if isinstance(value, dict):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _EncodeFault(f"dict key {key!r} is not a str")
            try:
                out[key] = _prepare(item, depth + 1)
            except _EncodeFault as fault:
                fault.path.append(key)
                raise
        if len(out) == 1 and next(iter(out)) in RESERVED_TAGS:
            if depth + 1 > MAX_DEPTH:
                raise _EncodeFault(f"nesting deeper than {MAX_DEPTH}")
            return {ESCAPE_TAG: out}
        return out
    if isinstance(value, (list, tuple)):
        items = []
        for i, item in enumerate(value):
            try:
                items.append(_prepare(item, depth + 1))
            except _EncodeFault as fault:
                fault.path.append(i)
                raise
        return items
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_TAG: base64.b64encode(value).decode("ascii")}
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return _prepare(int(value), depth)
    if isinstance(value, float):
        return _prepare(float(value), depth)
    raise _EncodeFault(f"{kind.__name__} is not JSON-compatible data")


def encode(value: Any) -> str:
    """Encode JSON-compatible data (bytes allowed) to compact JSON text. Raises `CodecError`."""
    try:
        text: str = _dumps(_prepare(value, 1))
    except _EncodeFault as fault:
        raise fault.as_codec_error() from None
    if not text.isascii() and _SURROGATE.search(text):
        raise CodecError("a string contains a lone surrogate, which is not valid Unicode")
    return text


class _Restart(Exception):
    """The fast decoding path met an escaped dict; decode again on the exact path."""


def _reject_constant(name: str) -> None:
    raise CodecError(f"{name} is not valid JSON")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        dup = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise CodecError(f"duplicate key {dup!r}")
    return out


def _bytes_from(encoded: Any) -> bytes:
    if not isinstance(encoded, str):
        raise CodecError(f"{BYTES_TAG} must hold a base64 string, not {type(encoded).__name__}")
    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        raise CodecError(f"{BYTES_TAG} holds invalid base64") from None
    if base64.b64encode(raw).decode("ascii") != encoded:
        raise CodecError(f"{BYTES_TAG} holds non-canonical base64")
    return raw


def _fast_hook(pairs: list[tuple[str, Any]]) -> Any:
    if len(pairs) == 1:
        key, inner = pairs[0]
        if key == BYTES_TAG:
            try:
                return _bytes_from(inner)
            except CodecError:
                raise _Restart from None  # may be a user dict under an escape: let the exact path judge
        if key == ESCAPE_TAG:
            raise _Restart
    return _unique(pairs)


class _Tag:
    """A single-reserved-key object seen by the exact path, resolved once its context is known."""

    __slots__ = ("key", "inner")

    def __init__(self, key: str, inner: Any) -> None:
        self.key = key
        self.inner = inner


def _exact_hook(pairs: list[tuple[str, Any]]) -> Any:
    if len(pairs) == 1 and pairs[0][0] in RESERVED_TAGS:
        return _Tag(*pairs[0])
    return _unique(pairs)


def _resolve(value: Any) -> Any:
    if isinstance(value, _Tag):
        if value.key == BYTES_TAG:
            return _bytes_from(value.inner)
        escaped = value.inner
        if not isinstance(escaped, _Tag):
            raise CodecError(f"{ESCAPE_TAG} must hold an object whose only key is a reserved tag")
        return {escaped.key: _resolve(escaped.inner)}
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(item, (dict, list, _Tag)):
                value[key] = _resolve(item)
        return value
    if isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list, _Tag)):
                value[i] = _resolve(item)
    return value


def _too_deep(value: Any, depth: int = 1) -> bool:
    """True when `value` nests containers deeper than MAX_DEPTH (counting the top level as 1)."""
    if depth > MAX_DEPTH:
        return True
    items = value.values() if type(value) is dict else value
    return any(type(item) in (dict, list) and _too_deep(item, depth + 1) for item in items)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise CodecError(f"number {literal[:40]} overflows to infinity")
    return value


def _loads(text: str, hook: Callable[[list[tuple[str, Any]]], Any]) -> Any:
    return json.loads(text, object_pairs_hook=hook, parse_constant=_reject_constant, parse_float=_finite_float)


def decode(text: str) -> Any:
    """Decode text produced by `encode` (or any JSON within the same limits). Raises `CodecError`."""
    if not isinstance(text, str):
        raise CodecError(f"expected str to decode, got {type(text).__name__}")
    if not text.isascii() and _SURROGATE.search(text):
        raise CodecError("the text contains a lone surrogate, which is not valid Unicode")
    try:
        try:
            value = _loads(text, _fast_hook)
        except _Restart:
            value = _resolve(_loads(text, _exact_hook))
    except CodecError:
        raise
    except RecursionError:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}") from None
    except ValueError as exc:  # JSONDecodeError, and int strings past the digit limit
        raise CodecError(f"invalid JSON: {exc}") from None
    if type(value) in (dict, list) and text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value):
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(value):
        raise CodecError("a string escape decodes to a lone surrogate, which is not valid Unicode")
    return value


def _has_surrogate(value: Any) -> bool:
    """Slow check, run only when the text has a surrogate escape: does any decoded string hold one?"""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        return any(_has_surrogate(k) or _has_surrogate(v) for k, v in value.items())
    if isinstance(value, list):
        return any(_has_surrogate(v) for v in value)
    return False
