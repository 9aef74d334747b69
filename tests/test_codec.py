"""Checkpoint codec behaviour, run on every kernel implementation (the `kernels` fixture).

The edge cases live in ``tests/vectors/codec.json`` (shared with the Rust kernel tests);
this file adds what only Python values can express: subclasses, bytearray/memoryview,
OrderedDict, namedtuples, the interpreter's int digit limit.
"""

from __future__ import annotations

import base64
import collections
import enum
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import durable_agent

VECTORS = json.loads((Path(__file__).parent / "vectors" / "codec.json").read_text("utf-8"))

_UNSUPPORTED: dict[str, Any] = {"set": lambda: {1}, "object": object, "complex": lambda: 1j}


def _int_from_text(text: str) -> int:
    """int(text), also past the interpreter's int-from-str digit limit."""
    digits = text.removeprefix("-")
    value = 0
    for start in range(0, len(digits), 1000):
        chunk = digits[start : start + 1000]
        value = value * 10 ** len(chunk) + int(chunk)
    return -value if text.startswith("-") else value


def from_tagged(node: Any) -> Any:
    """Build the Python value a vector describes (see the vector file's "tags")."""
    if isinstance(node, list):
        return [from_tagged(item) for item in node]
    if isinstance(node, dict):
        if len(node) == 1:
            ((tag, arg),) = node.items()
            if tag == "#int":
                return _int_from_text(arg)
            if tag == "#float":
                return float(arg)
            if tag == "#bytes":
                return bytes.fromhex(arg)
            if tag == "#str":
                return "".join(map(chr, arg))
            if tag == "#dict":
                return {from_tagged(k): from_tagged(v) for k, v in arg}
            if tag == "#tuple":
                return tuple(from_tagged(item) for item in arg)
            if tag == "#unsupported":
                return _UNSUPPORTED[arg]()
            if tag == "#nest":
                value = from_tagged(arg["leaf"])
                for _ in range(arg["depth"]):
                    value = [value]
                return value
        return {key: from_tagged(value) for key, value in node.items()}
    return node


def vector_text(vector: dict[str, Any]) -> str:
    if "text_parts" in vector:
        return "".join(piece * count for piece, count in vector["text_parts"])
    if "text_codepoints" in vector:
        return "".join(map(chr, vector["text_codepoints"]))
    text: str = vector["text"]
    return text


def strict_repr(value: Any) -> str:
    """A rendering that tells apart what == does not: True/1, 1/1.0, 0.0/-0.0, list/tuple.

    Plain loops and direct recursion only: under Pyodide the C stack is too small for 256
    levels of join() over generators.
    """
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            parts.append(strict_repr(key) + ": " + strict_repr(item))
        return "dict{" + ", ".join(parts) + "}"
    if isinstance(value, (list, tuple)):
        parts = []
        for item in value:
            parts.append(strict_repr(item))
        return type(value).__name__ + "[" + ", ".join(parts) + "]"
    return f"{type(value).__name__}:{value!r}"


def _ids(vectors: list[dict[str, Any]]) -> list[str]:
    return [v["name"] for v in vectors]


@pytest.mark.parametrize("vector", VECTORS["encode"], ids=_ids(VECTORS["encode"]))
def test_encode_vector(kernels: ModuleType, vector: dict[str, Any]) -> None:
    value = from_tagged(vector["value"])
    if "error" in vector:
        with pytest.raises(getattr(durable_agent, vector["error"])) as caught:
            kernels.encode(value)
        assert type(caught.value) is getattr(durable_agent, vector["error"])
        if "message" in vector:
            assert str(caught.value) == vector["message"]
    else:
        assert kernels.encode(value) == vector["text"]
        # Every encode vector round-trips (tuples come back as lists).
        assert kernels.encode(kernels.decode(vector["text"])) == vector["text"]


@pytest.mark.parametrize("vector", VECTORS["decode"], ids=_ids(VECTORS["decode"]))
def test_decode_vector(kernels: ModuleType, vector: dict[str, Any]) -> None:
    text = vector_text(vector)
    if "error" in vector:
        with pytest.raises(getattr(durable_agent, vector["error"])) as caught:
            kernels.decode(text)
        assert type(caught.value) is getattr(durable_agent, vector["error"])
    else:
        assert strict_repr(kernels.decode(text)) == strict_repr(from_tagged(vector["value"]))


# --- an independent statement of the codec (docs/codec.md), for generated input ----------------------
#
# The pure codec takes other paths under WebAssembly (Pyodide, Workers): it encodes a plain value by
# letting json read it directly and splicing large bytes' base64 into holes, and it decodes by cutting
# the bytes out of the text and measuring its depth before parsing. The public codec runs those paths
# in the Pyodide runs of this file (and the vectors above pin them too); everywhere, these tests hold
# whichever path runs to a reference written from the documented rules with the json module alone.

MAX_DEPTH = 256  # docs/codec.md, Limits
RESERVED = ("$bytes", "$esc")


class Refused(Exception):
    pass


def _lone_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def reference_encode(value: Any) -> str:
    """The text of a shallow value as docs/codec.md writes it; `Refused` where the codec refuses."""

    def tagged(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int)):
            return v
        if isinstance(v, float):
            if v != v or v in (float("inf"), float("-inf")):
                raise Refused
            return v
        if isinstance(v, str):
            if _lone_surrogate(v):
                raise Refused
            return v
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {"$bytes": base64.b64encode(bytes(v)).decode("ascii")}
        if isinstance(v, (list, tuple)):
            return [tagged(x) for x in v]
        if isinstance(v, dict):
            if not all(isinstance(k, str) and not _lone_surrogate(k) for k in v):
                raise Refused
            out = {k: tagged(x) for k, x in v.items()}
            return {"$esc": out} if len(out) == 1 and next(iter(out)) in RESERVED else out
        raise Refused

    return json.dumps(tagged(value), ensure_ascii=False, separators=(",", ":"))


@dataclass
class _Object:
    pairs: list[tuple[str, Any]]


def reference_decode(text: str) -> Any:
    """The value docs/codec.md reads from `text`; `Refused` where the codec refuses."""
    if _lone_surrogate(text) or _reference_depth(text) > MAX_DEPTH:
        raise Refused

    def constant(name: str) -> Any:
        raise Refused

    def resolve(node: Any) -> Any:
        if isinstance(node, list):
            return [resolve(x) for x in node]
        if isinstance(node, float) and node in (float("inf"), float("-inf")):
            raise Refused
        if isinstance(node, str) and _lone_surrogate(node):
            raise Refused
        if not isinstance(node, _Object):
            return node
        keys = [k for k, _ in node.pairs]
        if len(set(keys)) != len(keys) or any(_lone_surrogate(k) for k in keys):
            raise Refused
        if keys == ["$bytes"]:
            encoded = node.pairs[0][1]
            try:
                raw = base64.b64decode(encoded, validate=True) if isinstance(encoded, str) else None
            except ValueError:
                raw = None
            if raw is None or base64.b64encode(raw).decode("ascii") != encoded:
                raise Refused
            return raw
        if keys == ["$esc"]:
            inner = node.pairs[0][1]
            if not (isinstance(inner, _Object) and len(inner.pairs) == 1 and inner.pairs[0][0] in RESERVED):
                raise Refused
            return {inner.pairs[0][0]: resolve(inner.pairs[0][1])}
        return {k: resolve(v) for k, v in node.pairs}

    try:
        parsed = json.loads(text, object_pairs_hook=_Object, parse_constant=constant)
    except ValueError:  # not JSON, or an int beyond 4300 digits
        raise Refused from None
    return resolve(parsed)


def _decoded(decode: Any, text: str) -> str:
    try:
        return strict_repr(decode(text))
    except (durable_agent.CodecError, Refused):
        return "refused"


def _encoded(encode: Any, value: Any) -> str:
    try:
        return str(encode(value))
    except (durable_agent.CodecError, Refused):
        return "refused"


_PLAINISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.binary(max_size=4)
    | st.binary(max_size=4).map(bytearray),
    lambda inner: st.lists(inner, max_size=3)
    | st.lists(inner, max_size=3).map(tuple)
    | st.dictionaries(st.sampled_from(["$bytes", "$esc", "a", "$"]) | st.integers(0, 2), inner, max_size=2),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_PLAINISH)
def test_encode_agrees_with_the_reference_on_plain_values(kernels: ModuleType, value: Any) -> None:
    assert _encoded(kernels.encode, value) == _encoded(reference_encode, value)


_BIG = bytes(range(256)) * 2  # under WebAssembly, written through a hole (its base64 is 684 characters)
_HUGE = bytes(range(256)) * 300  # 100 KB of base64


@pytest.mark.parametrize(
    "value",
    [
        # a user dict with a `$bytes` key beside others, which a hole without its brace matches
        [_BIG, {"$bytes": "-", "a": _BIG[:-1]}, bytearray(_BIG), {"b": 1, "$bytes": "-"}, b"", _BIG],
        # the hole's text inside strings and keys (json escapes its quotes), small bytes (which
        # json writes itself) and empty ones
        ['{"$bytes":"-"}', {'{"$bytes":"-"}': _BIG}, b"", "x", b"\x01\x02", '{"$bytes":""}', _BIG[3:]],
        [bytes(range(n % 256)) * (n // 40 + 1) for n in range(0, 1200, 30)],
        {"only": _BIG},
        [_HUGE, {"k": _HUGE[1:]}, _BIG],
    ],
    ids=["beside-a-user-$bytes-key", "hole-text-in-strings", "small-and-large", "one", "huge"],
)
def test_each_bytes_object_is_written_with_its_own_base64(kernels: ModuleType, value: Any) -> None:
    """Under WebAssembly json writes each large bytes object as `{"$bytes":"-"}` and the base64
    is spliced in afterwards: each payload must land in its own object, whatever the strings,
    the other dicts and the smaller bytes objects hold."""
    text = kernels.encode(value)
    assert text == reference_encode(value)
    assert strict_repr(kernels.decode(text)) == strict_repr(reference_decode(text))


def test_a_lone_surrogate_beside_bytes_is_refused(kernels: ModuleType) -> None:
    """Under WebAssembly the lone-surrogate check runs before the base64 is spliced in (base64 is
    ASCII): a lone surrogate anywhere else is still refused."""
    for value in (["\ud800", _BIG], [_BIG, {"k\udfff": b"y"}]):
        with pytest.raises(durable_agent.CodecError) as caught:
            kernels.encode(value)
        assert str(caught.value) == "a string contains a lone surrogate, which is not valid Unicode"


_TAG_SOUP = st.lists(
    st.sampled_from(
        [
            '{"$bytes":"AA=="}',
            '{"$bytes":"Zh=="}',
            '{"$bytes":""}',
            '{"$bytes":"AA\\"}',
            '{"$bytes":"AA==","a":1}',
            '{"$esc":',
            '{"$bytes":',
            '"$bytes"',
            '"AA=="',
            "NaN",
            '"',
            '\\"',
            '"a"',
            "[",
            "]",
            "{",
            "}",
            ",",
            ":",
            "1",
            " ",
            "\n",
        ]
    ),
    max_size=14,
).map("".join)


@settings(max_examples=1500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_TAG_SOUP)
@example('["{"$bytes":"AA=="}"]')  # a tag inside a string: no JSON, refused, not ["\nNaN"]
@example('["a:{"$bytes":"AA=="}"]')
@example('{"$esc":{"$bytes":"AA=="}}')  # an escaped user dict, not bytes under $esc
@example('{"$esc":{"$bytes":"Zh=="}}')  # the same with base64 that is not canonical
@example('[NaN,{"$bytes":"AA=="}]')  # the text's own NaN
@example('[{"$bytes":"AA=="},NaN]')
@example('{"$bytes":{"$bytes":"AA=="}}')
@example('{"a":{"$bytes":"AA=="},"a":1}')  # a duplicate key beside a tag
@example("[" * 255 + '{"$bytes":"AA=="}' + "]" * 255)  # bytes at depth 256
@example("[" * 256 + '{"$bytes":"AA=="}' + "]" * 256)  # bytes at depth 257: refused
def test_decode_agrees_with_the_reference_around_bytes(kernels: ModuleType, text: str) -> None:
    """Under WebAssembly the pure decoder cuts `{"$bytes":"..."}` objects out of the text before it
    measures and parses it: on any text, with tags anywhere (inside strings, escaped, beside NaN, too
    deep), it must decode or refuse as the documented rules do."""
    assert _decoded(kernels.decode, text) == _decoded(reference_decode, text)


def test_vectors_cover_the_documented_edge_cases() -> None:
    names = " ".join(v["name"] for v in VECTORS["encode"] + VECTORS["decode"])
    for topic in (
        "float",
        "int64",
        "4301 digits",
        "surrogate",
        "non-ASCII",
        "depth 256",
        "depth 257",
        "duplicate key",
        "non-zero trailing bits",
        "padding",
        "escaped",
        "whitespace",
    ):
        assert topic in names, topic


# --- values only Python has ----------------------------------------------------------------


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Point(NamedTuple):
    x: int
    y: float


class LoudStr(str):
    def __str__(self) -> str:
        return "not the value"


class LoudFloat(float):
    def __float__(self) -> float:
        return 0.0

    def __repr__(self) -> str:
        return "nope"


def test_subclasses_are_written_as_their_base_value(kernels: ModuleType) -> None:
    value = [Color.RED, Level.HIGH, LoudStr("v"), LoudFloat(1.5), Point(1, 2.0), {LoudStr("k"): 1}]
    assert kernels.encode(value) == '["red",3,"v",1.5,[1,2.0],{"k":1}]'


def test_int_subclass_past_64_bits(kernels: ModuleType) -> None:
    class Big(int):
        def __repr__(self) -> str:
            return "nope"

    assert kernels.encode([Big(2**70)]) == f"[{2**70}]"


def test_bytes_likes(kernels: ModuleType) -> None:
    data = bytes(range(256))
    expected = kernels.encode(data)
    assert kernels.encode(bytearray(data)) == expected
    assert kernels.encode(memoryview(data)) == expected
    assert kernels.encode(memoryview(b"abcdef")[::2]) == kernels.encode(b"ace")  # not contiguous
    assert kernels.decode(expected) == data
    assert type(kernels.decode(expected)) is bytes


def test_released_memoryview_is_a_codec_error(kernels: ModuleType) -> None:
    view = memoryview(b"abc")
    view.release()
    with pytest.raises(durable_agent.CodecError, match="released memoryview"):
        kernels.encode({"a": [view]})


def test_ordered_dict_order_is_its_own(kernels: ModuleType) -> None:
    od = collections.OrderedDict([("a", 1), ("b", 2)])
    od.move_to_end("a")
    assert kernels.encode(od) == '{"b":2,"a":1}'
    assert kernels.encode(collections.OrderedDict(od)) == '{"b":2,"a":1}'


def test_dict_subclass_with_a_reserved_key_is_escaped(kernels: ModuleType) -> None:
    assert kernels.encode(collections.defaultdict(int, {"$bytes": 1})) == '{"$esc":{"$bytes":1}}'


def test_bool_is_not_an_int(kernels: ModuleType) -> None:
    decoded = kernels.decode("[true,1,1.0]")
    assert [type(v) for v in decoded] == [bool, int, float]


def test_decode_refuses_non_str(kernels: ModuleType) -> None:
    for bad in (b"[]", bytearray(b"[]"), None, 1):
        with pytest.raises(durable_agent.CodecError, match="expected str"):
            kernels.decode(bad)


def test_decode_accepts_str_subclass(kernels: ModuleType) -> None:
    assert kernels.decode(LoudStr('{"a":[1]}')) == {"a": [1]}


def test_codec_error_is_a_value_error_with_a_code(kernels: ModuleType) -> None:
    with pytest.raises(ValueError) as caught:
        kernels.encode({1})
    assert isinstance(caught.value, durable_agent.DurableAgentError)
    assert caught.value.code == "codec_error"


def test_decoded_values_are_fresh_and_mutable(kernels: ModuleType) -> None:
    text = '{"a":[1],"b":{"$bytes":"AA=="}}'
    first, second = kernels.decode(text), kernels.decode(text)
    first["a"].append(2)
    assert second["a"] == [1]


@pytest.mark.parametrize("limit", [0, 10_000])
def test_int_digits_capped_even_when_the_interpreter_allows_more(kernels: ModuleType, limit: int) -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        assert kernels.decode("9" * 4300) == int("9" * 4300)
        with pytest.raises(durable_agent.CodecError):
            kernels.decode("9" * 4301)
        with pytest.raises(durable_agent.CodecError):
            kernels.encode(10**4300)
    finally:
        sys.set_int_max_str_digits(old)


def test_int_digits_follow_a_lowered_interpreter_limit(kernels: ModuleType) -> None:
    old = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(1000)
    try:
        with pytest.raises(durable_agent.CodecError):
            kernels.decode("9" * 1001)
        with pytest.raises(durable_agent.CodecError):
            kernels.encode(10**1001)
        assert kernels.encode(10**999) == "1" + "0" * 999
    finally:
        sys.set_int_max_str_digits(old)


def test_realistic_checkpoint_round_trips(kernels: ModuleType) -> None:
    image = bytes(range(256)) * 64
    checkpoint = {
        "version": 1,
        "run_id": "run-\u00e9",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "fix the bug \U0001f41b"}]},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool-call",
                        "tool_call_id": "c1",
                        "tool_name": "read",
                        "input": {"path": "a.py"},
                    },
                ],
            },
            {
                "role": "tool",
                "content": [
                    {
                        "type": "tool-result",
                        "tool_call_id": "c1",
                        "tool_name": "read",
                        "output": {"$bytes": "user data that looks like a tag"},
                        "is_error": False,
                    },
                    {"type": "image", "data": image},
                ],
            },
        ],
        "usage": {"input_tokens": 10, "output_tokens": 2**40, "total_tokens": 2**70},
        "pending_approvals": [],
        "created_at": 1.7e12,
    }
    text = kernels.encode(checkpoint)
    assert kernels.decode(text) == checkpoint
    assert kernels.encode(kernels.decode(text)) == text


def _reference_depth(text: str) -> int:
    """Bracket depth outside strings, one character at a time (what json's parser sees)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


_TRICKY = st.text(alphabet='"\\[]{}:Na\n\u00e9', max_size=8)
_JSONISH = st.recursive(
    st.none() | st.integers() | _TRICKY,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TRICKY, inner, max_size=4),
    max_leaves=40,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_JSONISH, st.booleans())
@example("]][[[[", False)
@example(["[[[[", {"a": '"[[{'}], False)
def test_the_depth_limit_counts_brackets_outside_strings_only(kernels: ModuleType, value: Any, spaced: bool) -> None:
    """Under WebAssembly the depth is measured on the text before parsing, stripping its strings with
    str.split/replace: escaped quotes and backslashes inside strings must not fool it. A text nested
    exactly 256 deep decodes, one level more is refused."""
    text = json.dumps(value, ensure_ascii=False, indent=1 if spaced else None)
    room = MAX_DEPTH - _reference_depth(text)
    assert room >= 0
    deepest = "[" * room + text + "]" * room
    assert _decoded(kernels.decode, deepest) == _decoded(reference_decode, deepest) != "refused"
    with pytest.raises(durable_agent.CodecError):
        kernels.decode("[" + deepest + "]")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(_JSONISH | st.binary(max_size=6), st.booleans())
def test_decode_agrees_with_the_reference_on_json(kernels: ModuleType, value: Any, spaced: bool) -> None:
    """Strings full of quotes, brackets, colons and escapes, spaced or compact, with bytes among them."""
    text = kernels.encode(value)
    if spaced:
        text = json.dumps(json.loads(text), ensure_ascii=False, indent=1)
    assert _decoded(kernels.decode, text) == _decoded(reference_decode, text)


def _canonical(encoded: str) -> bool:
    import base64
    import binascii

    try:
        raw = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return False
    return base64.b64encode(raw).decode("ascii") == encoded


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.text(alphabet="AQZgh+/=\n é", max_size=12)
    | st.binary(max_size=7).map(lambda raw: __import__("base64").b64encode(raw).decode("ascii"))
)
def test_bytes_accepted_exactly_when_their_base64_is_canonical(kernels: ModuleType, encoded: str) -> None:
    text = json.dumps({"$bytes": encoded}, ensure_ascii=False, separators=(",", ":"))
    if _canonical(encoded):
        assert kernels.encode(kernels.decode(text)) == text
    else:
        with pytest.raises(durable_agent.CodecError):
            kernels.decode(text)
