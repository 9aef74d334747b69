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
* user objects are read by their data, once: a ``str`` subclass by its characters (never its
  methods), a dict subclass by one pass over its ``items()``, each container when it is reached
  (see "User objects" in the docs); and a value within the limits works however deep in its
  stack the caller already is.

Decoding never executes or imports anything: it only ever builds dicts, lists, strings,
numbers, booleans, None and bytes.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import functools
import gc
import json
import math
import re
import sys
import threading
from collections.abc import Callable, Iterator
from itertools import accumulate
from typing import Any, NoReturn

from ._errors import CodecError

BYTES_TAG = "$bytes"
ESCAPE_TAG = "$esc"
RESERVED_TAGS = frozenset({BYTES_TAG, ESCAPE_TAG})
MAX_DEPTH = 256
MAX_INT_DIGITS = 4300

# An int of at most this many bits has at most 640 digits: within any digit limit the
# interpreter can be set to (sys.set_int_max_str_digits accepts 0 or 640 and up).
_SAFE_INT_BITS = 2126
# Recursion headroom for the second try when the caller's stack was too deep: the pure codec
# takes about two frames per nesting level (_prepare and json's C encoder; json's C scanner and
# _resolve), so MAX_DEPTH levels fit twice over.
_HEADROOM = 4 * MAX_DEPTH
_HEADROOM_LOCK = threading.RLock()
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# See _cut_bytes.
_BYTES_OPEN = '{"' + BYTES_TAG + '":"'
_CUT_MARK = "\nNaN"
# The shape of a text (see _shape) keeps these bytes of its UTF-8 form, every other goes: the
# quotes (to find the strings), brackets, colons (one a pair), and N (of a NaN mark, _cut_bytes).
_NOT_SHAPE = bytes(sorted(set(range(256)) - set(b'"[]{}:N')))
_ESCAPED_QUOTE = re.compile(rb'\\"')  # a regex finds it faster than `in` does, on Pyodide
# An escaped quote or an escape that may decode to a surrogate: most texts hold neither.
_TRICKY_ESCAPE = re.compile(rb'\\(?:"|u[dD][89a-fA-F])')
_QUOTED = re.compile(rb'"[^"]*"')  # once escaped quotes are gone
_AS_BRACKETS = bytes.maketrans(b"{}", b"[]")
_BRACKET_STEP = {ord("["): 1, ord("]"): -1}
# _shape_depth peels this many innermost levels off with bytes.replace before counting the rest.
_PEEL_LEVELS = 16
_RELEASED_MEMORYVIEW = "a released memoryview holds no data"
_LONE_SURROGATE = "the text contains a lone surrogate, which is not valid Unicode"
# Under WebAssembly (Pyodide, Workers) the C stack can run out before CPython's recursion guard
# trips, which kills the runtime: there, a text that may nest too deep is measured before parsing.
_ON_WASM = sys.platform in ("emscripten", "wasi")

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


def _int_digit_limit() -> int:
    """The most digits an int may have: MAX_INT_DIGITS, or the interpreter's limit if lower."""
    limit = sys.get_int_max_str_digits()
    return MAX_INT_DIGITS if limit == 0 or limit > MAX_INT_DIGITS else limit


@functools.lru_cache(maxsize=4)
def _int_bound(digits: int) -> int:
    bound: int = 10**digits
    return bound


def _too_many_digits(digits: int) -> str:
    return f"integer with more than {digits} digits"


def _has_lone_surrogate(text: str) -> bool:
    """Does `text` hold a surrogate code point (U+D800-U+DFFF), which UTF-8 cannot store?

    The UTF-16 encoder refuses every one of them at C speed, several times faster than a
    regex (this check runs over every text encoded or decoded)."""
    if text.isascii():
        return False
    try:
        text.encode("utf-16-le")
    except UnicodeEncodeError:
        return True
    return False


def _shown(obj: object) -> str:
    """repr(obj) for a message, as its characters; `<TypeName>` if repr() fails or gives no Unicode."""
    try:
        text = str.__str__(repr(obj))
    except Exception:  # noqa: BLE001 - a message must not fail because user code did
        return f"<{type(obj).__name__}>"
    if _has_lone_surrogate(text):
        return f"<{type(obj).__name__}>"
    return text


def _key_text(key: object) -> str | None:
    """The characters of a str key (a subclass's own data, never its methods); None for a non-str."""
    if type(key) is str:
        return key
    return str.__str__(key) if isinstance(key, str) else None


def _pairs_of(mapping: dict[Any, Any]) -> list[tuple[Any, Any]]:
    """A dict subclass's pairs, from one pass over its `items()` (its `__len__`, `__iter__`
    and `keys()` are not used: a subclass is what its items() says)."""
    pairs = [pair for pair in mapping.items()]  # noqa: C416 - a comprehension: no length hint asked of items()
    for pair in pairs:
        if type(pair) is not tuple or len(pair) != 2:
            got = f"a tuple of {len(pair)}" if type(pair) is tuple else type(pair).__name__
            raise _EncodeFault(f"{type(mapping).__name__}.items() gave {got}, not a (key, value) tuple")
    return pairs


def _prepare(value: Any, depth: int) -> Any:
    """Validate `value` and rewrite it into plain JSON data (bytes tagged, reserved dicts escaped).

    `depth` is the nesting depth `value` will have in the text if it is a container: every
    dict, list and tuple counts 1, bytes count 1 (they become an object), and a dict written
    escaped counts 2 (the `{"$esc": ...}` wrapper, then the dict itself).

    Each container is read once, when it is reached (see docs/codec.md, "User objects"): a
    dict's pairs and a list's items are copied before any of them is visited, so code run
    meanwhile (a subclass's methods, another thread) cannot change what is written for it.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None:
        return value
    if kind is int:
        if value.bit_length() > _SAFE_INT_BITS:
            digits = _int_digit_limit()
            if abs(value) >= _int_bound(digits):
                raise _EncodeFault(_too_many_digits(digits))
        return value
    if kind is float:
        if not math.isfinite(value):
            raise _EncodeFault(f"{value!r} is not valid JSON (NaN and infinities are refused)")
        return value
    if isinstance(value, dict):
        if depth > MAX_DEPTH:
            raise _too_deep_fault()
        pairs = list(value.items()) if kind is dict else _pairs_of(value)
        escaped = len(pairs) == 1 and _key_text(pairs[0][0]) in RESERVED_TAGS
        if escaped and depth + 1 > MAX_DEPTH:
            raise _too_deep_fault()
        inner = depth + 2 if escaped else depth + 1
        out = {}
        # Only keys that are not plain str (or pairs not from a plain dict) can repeat a key's
        # characters; from the first such key on, every key is checked against the earlier ones.
        careful = kind is not dict
        for key, item in pairs:
            if type(key) is not str:
                if not isinstance(key, str):
                    raise _EncodeFault(f"dict key {_shown(key)} is not a str")
                key = str.__str__(key)
                careful = True
            if careful and key in out:
                raise _EncodeFault(f"duplicate key {key!r}")
            try:
                out[key] = _prepare(item, inner)
            except _EncodeFault as fault:
                fault.path.append(key)
                raise
        return {ESCAPE_TAG: out} if escaped else out
    if isinstance(value, (list, tuple)):
        if depth > MAX_DEPTH:
            raise _too_deep_fault()
        # A plain list is copied (a plain tuple cannot change); a subclass is iterated once.
        items = value[:] if kind is list or kind is tuple else [item for item in value]  # noqa: C416 - only __iter__
        prepared = []
        for i, item in enumerate(items):
            try:
                prepared.append(_prepare(item, depth + 1))
            except _EncodeFault as fault:
                fault.path.append(i)
                raise
        return prepared
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


@contextlib.contextmanager
def _headroom() -> Iterator[None]:
    """Raise the recursion limit by `_HEADROOM` frames meanwhile (one thread at a time)."""
    with _HEADROOM_LOCK:
        limit = sys.getrecursionlimit()
        sys.setrecursionlimit(limit + _HEADROOM)
        try:
            yield
        finally:
            sys.setrecursionlimit(limit)


def _with_headroom(work: Callable[[Any], Any], arg: Any) -> Any:
    """`work(arg)`; if the caller's stack is too deep for it, once more with `_HEADROOM` frames
    to spare. Both codecs work at every nesting within the limits whatever the caller's depth
    (the native one does not recurse in Python); the pure one needs about two frames a level."""
    try:
        return work(arg)
    except RecursionError:
        pass
    with _headroom():
        return work(arg)


class _NotPlain(Exception):
    """The value holds something `_plain` leaves to `_prepare`."""


def _plain(value: Any, depth: int) -> Any:
    """`_prepare` for data made of the exact builtin types alone, the common case, about twice
    as fast: it raises `_NotPlain` at anything else (a subclass, a non-str key, a dict to escape,
    a memoryview, too deep), having run no user code, so `_prepare` can start over.

    Scalars are left to json's encoder to refuse (NaN, infinities, and ints past the digit limit
    when the interpreter's limit is the codec's, see `_encode`): a ValueError from it also
    sends the value to `_prepare`, which says what is wrong and where. Identity tests only
    (no `type(x) in set`): hashing a type can run its metaclass's code.
    """
    kind = type(value)
    if depth > MAX_DEPTH:
        raise _NotPlain
    if kind is dict:
        # Read once, when reached (see _prepare). Not dict.copy(): copying a dict that once
        # held more keys inserts them anew, which can call a user key's __eq__.
        out = {}
        for key, item in list(value.items()):
            if type(key) is not str:
                raise _NotPlain
            kind = type(item)
            if not (kind is str or kind is int or kind is bool or kind is float or item is None):
                item = _plain(item, depth + 1)
            out[key] = item
        if len(out) == 1 and key in RESERVED_TAGS:
            raise _NotPlain
        return out
    if kind is list:
        items = value[:]
    elif kind is tuple:
        items = list(value)
    elif kind is bytes or kind is bytearray:
        return {BYTES_TAG: binascii.b2a_base64(value, newline=False).decode("ascii")}
    else:
        raise _NotPlain
    i = 0
    for item in items:  # no enumerate(): a tuple per item costs more than the count
        kind = type(item)
        if not (kind is str or kind is int or kind is bool or kind is float or item is None):
            items[i] = _plain(item, depth + 1)
        i += 1
    return items


def _check_plain(value: Any, depth: int) -> None:
    """Raise `_NotPlain` where `_plain` would, having run no user code, but copy nothing: the
    WebAssembly fast path (see `_encode_plain`) lets json's encoder read `value` itself."""
    kind = type(value)
    if depth > MAX_DEPTH:
        raise _NotPlain
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            kind = type(item)
            if not (kind is str or kind is int or kind is bool or kind is float or item is None):
                _check_plain(item, depth + 1)
        if len(value) == 1 and key in RESERVED_TAGS:
            raise _NotPlain
    elif kind is list or kind is tuple:
        for item in value:
            kind = type(item)
            if not (kind is str or kind is int or kind is bool or kind is float or item is None):
                _check_plain(item, depth + 1)
    elif not (kind is bytes or kind is bytearray):
        raise _NotPlain


# On the WebAssembly fast path json writes this object in place of a bytes object, and the
# base64 is spliced in afterwards (see `_HoleWriter`); "-" is no base64, so no bytes object
# is ever written as it.
_BYTES_HOLE = {BYTES_TAG: "-"}
_BYTES_HOLE_TEXT = '{"' + BYTES_TAG + '":"-"}'
# Base64 shorter than this is written by json itself: under Pyodide its escape scan costs about
# 5 ns a character, a splice about 1.6 us a call.
_HOLE_MIN = 512
_BYTES_CLOSE = '"}'


class _HoleWriter(json.JSONEncoder):
    """json's encoder on the WebAssembly fast path, for a value `_check_plain` let through: it
    writes each bytes object of `_HOLE_MIN` base64 characters or more as the hole
    `{"$bytes":"-"}` and keeps its base64 in `payloads`, in order (see `_splice_bytes`).

    json's encoder scans every string it writes for characters to escape, one at a time: under
    WebAssembly that scan of the base64 (often most of a checkpoint's text) cost about a fifth
    of the encoding, and base64 never needs one. One writer serves every call (making one
    costs about an eighth of encoding a small value there): the fast path uses it only where
    no other thread can run, and nothing json calls meanwhile can encode again."""

    def __init__(self) -> None:
        super().__init__(ensure_ascii=False, separators=(",", ":"), allow_nan=False, check_circular=False)
        self.payloads: list[str] = []

    def default(self, o: Any) -> dict[str, str]:
        if type(o) is bytes or type(o) is bytearray:
            encoded = binascii.b2a_base64(o, newline=False).decode("ascii")
            if len(encoded) < _HOLE_MIN:
                return {BYTES_TAG: encoded}
            self.payloads.append(encoded)
            return _BYTES_HOLE
        raise _NotPlain  # `_check_plain` let nothing else through


_HOLE_WRITER = _HoleWriter()


def _splice_bytes(text: str, payloads: list[str]) -> str:
    """`text` from a `_HoleWriter` with each hole filled by its base64 (its `payloads`), in order.

    Every `{"$bytes":"-"}` in such a text is a hole: "-" is no base64, so no bytes object json
    wrote itself reads so; the value passed `_check_plain`, so none of its own dicts is a lone
    `$bytes` key; and a string cannot hold the text raw (json escapes its quotes)."""
    pieces = text.split(_BYTES_HOLE_TEXT)
    if len(pieces) != len(payloads) + 1:
        raise AssertionError("every hole is a bytes object's")
    out = [pieces[0]]
    for payload, piece in zip(payloads, pieces[1:]):  # noqa: B905 - lengths checked above
        out += (_BYTES_OPEN, payload, _BYTES_CLOSE, piece)
    return "".join(out)


def _refuse_lone_surrogates(text: str) -> str:
    if _has_lone_surrogate(text):
        raise CodecError("a string contains a lone surrogate, which is not valid Unicode")
    return text


def _encode_plain(value: Any, *, isolated: bool = _ON_WASM) -> str | None:
    """The text of `value` through `_plain`, or None when `_prepare` must handle it; raises
    `CodecError` for a lone surrogate.

    `isolated` says no other thread can run (so under WebAssembly). Then, with the cyclic GC
    paused so that no finalizer runs either, nothing can change `value` between
    `_check_plain` and json's encoder: the encoder reads it directly instead of `_plain`'s
    copy, about a third of the time saved, and writes its bytes as holes filled afterwards
    (see `_HoleWriter`), which also leaves the base64 out of the lone-surrogate check.
    """
    limit = sys.get_int_max_str_digits()
    if limit == 0 or limit > MAX_INT_DIGITS:
        return None  # json's encoder would write ints the codec refuses
    # The cyclic GC is paused meanwhile (as the native decoder pauses it): _plain's copies are
    # thousands of fresh containers, none of them garbage until json has written them, and
    # collections that scan them cost about a sixth of the encoding. Nothing here runs user code.
    payloads: list[str] = []
    paused = gc.isenabled()
    if paused:
        gc.disable()
    try:
        if isolated:
            _check_plain(value, 1)
            _HOLE_WRITER.payloads = payloads
            text = _HOLE_WRITER.encode(value)
        else:
            text = _dumps(_plain(value, 1))
    except (_NotPlain, ValueError):
        return None
    finally:
        if paused:
            gc.enable()
    text = _refuse_lone_surrogates(text)
    return _splice_bytes(text, payloads) if payloads else text


def _encode(value: Any) -> str:
    text = _encode_plain(value)
    if text is not None:
        return text
    try:
        prepared = _prepare(value, 1)
    except _EncodeFault as fault:
        raise fault.as_codec_error() from None
    try:
        text = _dumps(prepared)
    except ValueError as exc:  # an int past an interpreter limit lowered while encoding
        raise CodecError(f"cannot encode: {exc}") from None
    return _refuse_lone_surrogates(text)


def encode(value: Any) -> str:
    """Encode JSON-compatible data (bytes allowed) to compact JSON text. Raises `CodecError`."""
    result: str = _with_headroom(_encode, value)
    return result


class _Restart(Exception):
    """The fast decoding path met an escaped dict (or a text whose bytes were cut out, see
    `_cut_bytes`, met a duplicate key); decode again on the exact path."""


def _reject_constant(name: str) -> NoReturn:
    raise CodecError(f"{name} is not valid JSON")


def _constants_giving(payloads: list[bytes]) -> Callable[[str], Any]:
    """json's `parse_constant` for a text `_cut_bytes` made: each NaN is the next bytes cut out
    (a NaN the text held itself leaves one too few, and the last is refused)."""
    queue = iter(payloads)

    def constant(name: str) -> Any:
        if name == "NaN":
            for raw in queue:
                return raw
        _reject_constant(name)

    return constant


def _cut_bytes(text: str) -> tuple[str, list[bytes]] | None:
    """`text` with each `{"$bytes":"..."}` object cut out and `_CUT_MARK` in its place, and the
    bytes they hold, in order; None if it holds no such object, or one that is not exactly that
    object with canonical base64 (which json reads as the same string: no escape, no quote).

    A checkpoint's bytes are often most of its text: cut out, their base64 is neither measured
    nor parsed as a string. Where the text is JSON, such an object's `{"` opens it (inside a
    string, the quote would end the string and the `$` after it be no JSON). The mark is a NaN
    token, which json hands to `parse_constant`, after a raw newline, which json allows only
    outside strings: a text that was no JSON stays no JSON.
    """
    start = text.find(_BYTES_OPEN)
    if start < 0:
        return None
    pieces: list[str] = []
    payloads: list[bytes] = []
    end = 0
    while start >= 0:
        pieces.append(text[end:start])
        begin = start + len(_BYTES_OPEN)
        close = text.find('"', begin)
        if close < 0 or not text.startswith("}", close + 1):
            return None
        try:
            payloads.append(_bytes_from(text[begin:close]))
        except CodecError:
            return None
        end = close + 2
        start = text.find(_BYTES_OPEN, end)
    pieces.append(text[end:])
    return _CUT_MARK.join(pieces), payloads


def _duplicate_key(pairs: list[tuple[str, Any]]) -> CodecError:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return CodecError(f"duplicate key {key!r}")
        seen.add(key)
    raise AssertionError("called only on pairs that hold a duplicate key")


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise _duplicate_key(pairs)
    return out


def _bytes_from(encoded: Any) -> bytes:
    if not isinstance(encoded, str):
        raise CodecError(f"{BYTES_TAG} must hold a base64 string, not {type(encoded).__name__}")
    try:
        raw = binascii.a2b_base64(encoded, strict_mode=True)
    except (binascii.Error, ValueError):
        raise CodecError(f"{BYTES_TAG} holds invalid base64") from None
    # Strict mode leaves only base64 characters with padding at the end, and every complete
    # group of four such characters is the one encoding of its three bytes: the text is
    # canonical when it has the canonical length and its last group is the canonical one.
    tail = len(raw) % 3 or 3
    if len(encoded) != (len(raw) + 2) // 3 * 4 or encoded[-4:] != base64.b64encode(raw[-tail:]).decode():
        raise CodecError(f"{BYTES_TAG} holds non-canonical base64")
    return raw


def _untagged(key: str, inner: Any, obj: dict[str, Any]) -> Any:
    """A one-key object `obj` as the fast paths decode it: bytes for a `$bytes` tag, else `obj`;
    `_Restart` for what only the exact path can judge (an escape, a `$bytes` that may be a
    user dict under one)."""
    if key == BYTES_TAG:
        try:
            return _bytes_from(inner)
        except CodecError:
            raise _Restart from None
    if key == ESCAPE_TAG:
        raise _Restart
    return obj


def _fast_hook(pairs: list[tuple[str, Any]]) -> Any:
    out = dict(pairs)
    if len(out) == len(pairs) != 1:  # the common case first: one call, no other work
        return out
    if len(out) != len(pairs):
        raise _duplicate_key(pairs)
    return _untagged(*pairs[0], out)


def _loads_counting_keys(text: str, payloads: list[bytes] | None = None) -> tuple[Any, int]:
    """The fast path's value of `text` through json's `object_hook`, and how many keys its
    objects kept.

    An object hook gets each object as the dict json built: no tuple per pair, no second dict,
    about half the cost of `_fast_hook`, but blind to duplicate keys, which the dict drops. The
    caller knows how many pairs the text holds: the two counts differ if and only if a key was
    dropped. `payloads` are the bytes `_cut_bytes` cut out of `text`, if it made `text`.
    """
    kept = 0

    def hook(obj: dict[str, Any]) -> Any:
        nonlocal kept
        size = len(obj)
        kept += size
        if size != 1:
            return obj
        for key in obj:
            return _untagged(key, obj[key], obj)

    constant = _reject_constant if payloads is None else _constants_giving(payloads)
    return _loads(text, object_hook=hook, constant=constant), kept


class _Tag:
    """A single-reserved-key object seen by the exact path, resolved once its context is known."""

    __slots__ = ("inner", "key")

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


def _may_nest_too_deep(text: str) -> bool:
    """A quick bound: a text with at most MAX_DEPTH open brackets cannot nest deeper."""
    return text.count("[") + text.count("{") > MAX_DEPTH


def _shape(data: bytes, *, escapes: bool = True) -> bytes:
    """The brackets, colons and `N`s of UTF-8 JSON text `data` outside its strings (of another
    text: at least those json's parser reads before it stops), at C speed: under WebAssembly
    this runs before every parse. `escapes=False` says the text holds no escaped quote.

    UTF-8 writes every non-ASCII character with bytes past 0x7F, so a byte that looks like a
    quote or a bracket is one. If a quote is escaped at all, escaped backslashes, then escaped
    quotes are dropped (bytes.replace pairs them left to right as json reads them), so that
    each quote left opens or closes a string. Then every byte but those kept, then each `""`
    (an empty string, or a string's end and the next one's start with nothing kept between:
    either way nothing outside strings goes), then the strings left.
    (An unterminated string stays: its brackets count, an overestimate.)
    """
    if escapes and _ESCAPED_QUOTE.search(data):
        data = data.replace(b"\\\\", b"").replace(b'\\"', b"")
    return _QUOTED.sub(b"", data.translate(None, _NOT_SHAPE).replace(b'""', b""))


def _text_depth(text: str) -> int:
    """How deep the brackets outside strings nest: exact for JSON text, and for any other text
    at least as deep as json's parser goes in it before it stops."""
    return _shape_depth(_shape(text.encode("utf-8", "surrogatepass")))


def _shape_depth(shape: bytes) -> int:
    """How deep the brackets of `shape` (see `_shape`) nest.

    Keep the brackets, all as `[` and `]`; peel innermost `[]` pairs level by level (a
    checkpoint nests a handful deep) and count whatever is left.
    """
    brackets = shape.translate(_AS_BRACKETS, b'":N')  # an unterminated string's quote goes too
    peeled = 0
    while peeled < _PEEL_LEVELS and b"[" in brackets:
        inner = brackets.replace(b"[]", b"")
        if len(inner) == len(brackets):
            break  # no pair left to peel: not JSON
        brackets, peeled = inner, peeled + 1
    if b"[" not in brackets:
        return peeled  # every open bracket was closed within `peeled` levels
    # What is left nests as deep as the text less the levels peeled off (exact for JSON).
    return peeled + max(accumulate(map(_BRACKET_STEP.__getitem__, brackets), initial=0))


def _bounded_int(literal: str) -> int:
    """int(literal), refusing more than MAX_INT_DIGITS digits even if the process allows more."""
    if len(literal) - literal.startswith("-") > MAX_INT_DIGITS:
        raise CodecError(_too_many_digits(MAX_INT_DIGITS))
    return int(literal)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise CodecError(f"number {literal[:40]} overflows to infinity")
    return value


def _loads(
    text: str,
    *,
    pairs_hook: Callable[[list[tuple[str, Any]]], Any] | None = None,
    object_hook: Callable[[dict[str, Any]], Any] | None = None,
    constant: Callable[[str], Any] = _reject_constant,
) -> Any:
    # The interpreter's own int-from-str limit (4300 digits by default) already refuses longer
    # ints, fast; only when it was raised or lifted must every int literal be checked here.
    limit = sys.get_int_max_str_digits()
    parse_int = _bounded_int if limit == 0 or limit > MAX_INT_DIGITS else None
    return json.loads(
        text,
        object_pairs_hook=pairs_hook,
        object_hook=object_hook,
        parse_constant=constant,
        parse_float=_finite_float,
        parse_int=parse_int,
    )


def decode(text: str) -> Any:
    """Decode text produced by `encode` (or any JSON within the same limits). Raises `CodecError`."""
    if not isinstance(text, str):
        raise CodecError(f"expected str to decode, got {type(text).__name__}")
    if type(text) is not str:
        text = str.__str__(text)  # a subclass is decoded from its characters, never its methods
    if _ON_WASM:
        return _decode_measured(text)
    if _has_lone_surrogate(text):
        raise CodecError(_LONE_SURROGATE)
    return _with_headroom(_decode, text)


def _decode_measured(text: str) -> Any:
    """`decode` under WebAssembly, where the C stack can run out before CPython's recursion
    guard trips (which kills the runtime): the text is measured before it is parsed. The
    measure also counts its pairs, which lets `_parse` take its cheapest path.

    The text's bytes objects are cut out first (see `_cut_bytes`); if the cut text is refused
    or needs the exact path, the text is decoded again as it is, which says what is wrong."""
    cut = _cut_bytes(text)
    if cut is not None:
        try:
            return _measure_and_decode(*cut)
        except (CodecError, _Restart):
            pass
    return _measure_and_decode(text, None)


def _measure_and_decode(text: str, payloads: list[bytes] | None) -> Any:
    """`_decode_measured` of `text`, which `_cut_bytes` made if `payloads` are given."""
    pairs, escapes = _measure(text, payloads)
    return _with_headroom(lambda text: _decode(text, pairs, escapes, payloads), text)


def _measure(text: str, payloads: list[bytes] | None) -> tuple[int, bool]:
    """How many pairs the objects of `text` hold, and whether it may hold an escaped quote or
    an escape that may decode to a surrogate; `CodecError` for a lone surrogate or nesting
    deeper than MAX_DEPTH. `payloads` as for `_measure_and_decode`."""
    # A payload cut out is base64: it held no surrogate and no backslash, so what is left tells.
    try:
        data = text.encode("utf-8")  # which refuses lone surrogates
    except UnicodeEncodeError:
        raise CodecError(_LONE_SURROGATE) from None
    escapes = _TRICKY_ESCAPE.search(data) is not None
    shape = _shape(data, escapes=escapes)
    if payloads is not None:
        shape = shape.replace(b"N", b"[]")  # a NaN mark stands for a bytes object, one level deep
    if _shape_depth(shape) > MAX_DEPTH:
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    return shape.count(b":"), escapes  # JSON has a colon outside strings for each pair, no other


def _parse(text: str, pairs: int | None, payloads: list[bytes] | None = None) -> Any:
    """json's value of `text`, on the cheapest path that can tell it (see `decode`)."""
    try:
        if pairs is not None:
            value, kept = _loads_counting_keys(text, payloads)
            if kept == pairs:
                return value
            if payloads is not None:
                raise _Restart  # a duplicate key: the text as it is will name it
        return _loads(text, pairs_hook=_fast_hook)  # also the judge of duplicate keys
    except _Restart:
        if payloads is not None:
            raise
        return _resolve(_loads(text, pairs_hook=_exact_hook))


def _decode(
    text: str, pairs: int | None = None, escapes: bool = True, payloads: list[bytes] | None = None
) -> Any:
    """`decode` once the text is checked; `pairs`, when known (under WebAssembly, where the
    text is measured first), is how many pairs its objects hold; `escapes=False` says the
    text holds no escape that may decode to a surrogate; `payloads` are the bytes
    `_cut_bytes` cut out of `text`, if it made `text`."""
    try:
        value = _parse(text, pairs, payloads)
    except CodecError:
        raise
    except RecursionError:
        if _text_depth(text) > MAX_DEPTH:
            raise CodecError(f"nesting deeper than {MAX_DEPTH}") from None
        raise  # the caller's stack was too deep, not the text: decode() tries again with headroom
    except json.JSONDecodeError as exc:
        raise CodecError(f"invalid JSON: {exc}") from None
    except ValueError:  # an int literal past the interpreter's int-from-str digit limit
        raise CodecError(_too_many_digits(_int_digit_limit())) from None
    # Under WebAssembly the text's depth was measured before parsing; elsewhere the value's is.
    if not _ON_WASM and type(value) in _NESTED and _may_nest_too_deep(text) and _too_deep(value):
        raise CodecError(f"nesting deeper than {MAX_DEPTH}")
    if escapes and _SURROGATE_ESCAPE.search(text) and _has_surrogate(value):
        raise CodecError("a string escape decodes to a lone surrogate, which is not valid Unicode")
    return value


def _has_surrogate(value: Any) -> bool:
    """Slow check, run only when the text has a surrogate escape: does any decoded string hold one?"""
    if isinstance(value, str):
        return _has_lone_surrogate(value)
    if isinstance(value, dict):
        for key, item in value.items():
            if _has_surrogate(key) or _has_surrogate(item):
                return True
    elif isinstance(value, list):
        for item in value:
            if _has_surrogate(item):
                return True
    return False
