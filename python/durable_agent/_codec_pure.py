"""The reference checkpoint codec: JSON-compatible data (plus bytes) to compact JSON text and back.

This module is the specification the native codec must match byte for byte; the format
is written down in ``docs/codec.md``. In short:

* compact JSON (``,`` and ``:`` separators), keys in insertion order, non-ASCII written raw,
  floats as Python ``repr``; NaN and infinities are refused;
* ``bytes``/``bytearray``/``memoryview`` become ``{"$bytes": "<standard padded base64>"}``;
* a user dict whose only key is a reserved tag (``$bytes`` or ``$esc``) is written as
  ``{"$esc": {...}}`` and reads back as the same dict, so the codec is lossless;
* strings must be valid Unicode (a lone surrogate is refused: it cannot be stored as UTF-8);
* nesting deeper than ``MAX_DEPTH`` containers *as written in the text* (so bytes count as
  the object they become, and an escaped dict counts twice) and integers of more than
  ``MAX_INT_DIGITS`` decimal digits are refused, on both sides, so both sides agree on every
  input: whatever decodes re-encodes to the same text.

Decoding never executes or imports anything: it only ever builds dicts, lists, strings,
numbers, booleans, None and bytes.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import sys
from collections.abc import Callable
from itertools import accumulate
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
_RELEASED_MEMORYVIEW = "a released memoryview holds no data"
# Under WebAssembly (Pyodide, Workers) the C stack can run out before CPython's recursion guard
# trips, which kills the runtime: there, a text that may nest too deep is measured first.
_ON_WASM = sys.platform in ("emscripten", "wasi")
_JSON_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}

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


def _too_deep_fault() -> _EncodeFault:
    return _EncodeFault(f"nesting deeper than {MAX_DEPTH}")


def _prepare(value: Any, depth: int) -> Any:
    """Validate `value` and rewrite it into plain JSON data (bytes tagged, reserved dicts escaped).

    `depth` is the nesting depth `value` will have in the text if it is a container: every
    dict, list and tuple counts 1, bytes count 1 (they become an object), and a dict written
    escaped counts 2 (the `{"$esc": ...}` wrapper, then the dict itself).
    """
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
    if isinstance(value, dict):
        if depth > MAX_DEPTH:
            raise _too_deep_fault()
        escaped = len(value) == 1 and next(iter(value)) in RESERVED_TAGS
        if escaped and depth + 1 > MAX_DEPTH:
            raise _too_deep_fault()
        inner = depth + 2 if escaped else depth + 1
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise _EncodeFault(f"dict key {key!r} is not a str")
            try:
                out[key] = _prepare(item, inner)
            except _EncodeFault as fault:
                fault.path.append(key)
                raise
        return {ESCAPE_TAG: out} if escaped else out
    if isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            raise _too_deep_fault()
        items = []
        for i, item in enumerate(value):
            try:
                items.append(_prepare(item, depth + 1))
            except _EncodeFault as fault:
                fault.path.append(i)
                raise
        return items
    if isinstance(value, (bytes, bytearray, memoryview)):
        if depth > MAX_DEPTH:
            raise _too_deep_fault()
        if isinstance(value, memoryview):
            try:
                value = value.tobytes()  # any shape, contiguous or not: its bytes in C order
            except ValueError:
                raise _EncodeFault(_RELEASED_MEMORYVIEW) from None
        return {BYTES_TAG: base64.b64encode(value).decode("ascii")}
    # Subclasses of str, int and float are written as their base value (not their __str__,
    # so a `class Color(str, Enum)` member is written as its value, as json.dumps does).
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return _prepare(int.__int__(value), depth)
    if isinstance(value, float):
        return _prepare(float.__float__(value), depth)
    raise _EncodeFault(f"{kind.__name__} is not JSON-compatible data")


def encode(value: Any) -> str:
    """Encode JSON-compatible data (bytes allowed) to compact JSON text. Raises `CodecError`."""
    try:
        text: str = _dumps(_prepare(value, 1))
    except _EncodeFault as fault:
        raise fault.as_codec_error() from None
    except ValueError as exc:  # an int past a lowered sys.set_int_max_str_digits()
        raise CodecError(f"cannot encode: {exc}") from None
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
    """True when the text of `value` nests containers deeper than MAX_DEPTH (the outermost is 1).

    The decoded value determines its text: bytes were a `{"$bytes": ...}` object, and a dict
    whose only key is a reserved tag was written `{"$esc": {...}}`, one level deeper.
    """
    kind = type(value)
    if kind is dict:
        if len(value) == 1 and next(iter(value)) in RESERVED_TAGS:
            depth += 1
        items = value.values()
    elif kind is list:
        items = value
    else:  # bytes
        return depth > MAX_DEPTH
    if depth > MAX_DEPTH:
        return True
    # Plain loops and direct calls (no any() over a generator): Python-to-Python calls do not
    # grow the C stack, which under WebAssembly is small.
    for item in items:
        if type(item) in _NESTED and _too_deep(item, depth + 1):
            return True
    return False


_NESTED = (dict, list, bytes)


def _text_depth(text: str) -> int:
    """How deep the brackets outside strings nest (exact for JSON; an overestimate at worst)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0)


def _bounded_int(literal: str) -> int:
    """int(literal), refusing more than MAX_INT_DIGITS digits even if the process allows more."""
    if len(literal) - literal.startswith("-") > MAX_INT_DIGITS:
        raise CodecError(f"integer with more than {MAX_INT_DIGITS} digits")
    return int(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise CodecError(f"number {literal[:40]} overflows to infinity")
    return value


def _loads(text: str, hook: Callable[[list[tuple[str, Any]]], Any]) -> Any:
    # The interpreter's own int-from-str limit (4300 digits by default) already refuses longer
    # ints, fast; only when it was raised or lifted must every int literal be checked here.
    limit = sys.get_int_max_str_digits()
    parse_int = _bounded_int if limit == 0 or limit > MAX_INT_DIGITS else None
    return json.loads(
        text,
        object_pairs_hook=hook,
        parse_constant=_reject_constant,
        parse_float=_finite_float,
        parse_int=parse_int,
    )


def decode(text: str) -> Any:
    """Decode text produced by `encode` (or any JSON within the same limits). Raises `CodecError`."""
    if not isinstance(text, str):
        raise CodecError(f"expected str to decode, got {type(text).__name__}")
    if not text.isascii() and _SURROGATE.search(text):
        raise CodecError("the text contains a lone surrogate, which is not valid Unicode")
    if _ON_WASM and text.count("[") + text.count("{") > MAX_DEPTH and _text_depth(text) > MAX_DEPTH:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
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
    if type(value) in _NESTED and text.count("[") + text.count("{") > MAX_DEPTH and _too_deep(value):
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if _SURROGATE_ESCAPE.search(text) and _has_surrogate(value):
        raise CodecError("a string escape decodes to a lone surrogate, which is not valid Unicode")
    return value


def _has_surrogate(value: Any) -> bool:
    """Slow check, run only when the text has a surrogate escape: does any decoded string hold one?"""
    if isinstance(value, str):
        return _SURROGATE.search(value) is not None
    if isinstance(value, dict):
        for key, item in value.items():
            if _has_surrogate(key) or _has_surrogate(item):
                return True
    elif isinstance(value, list):
        for item in value:
            if _has_surrogate(item):
                return True
    return False
