"""Parity: the native codec against the pure reference, byte for byte, on generated input.

Encode: same text, or the same exception class *and message*. Decode: same value (types
included), or the same exception class; on valid texts and on mutated/malformed ones.

It runs in the pure-only run (DURABLE_AGENT_NATIVE=0), where the public codec
(`durable_agent.backends.encode`/`decode`) and `ApprovalSigner` run the pure kernels, against the
extension imported as the package it is (`durable_agent_native`). In the native run the public codec
is the extension itself, so the comparison would hold trivially: it is skipped there. scripts/test
runs both; a missing extension fails the native run (test_native_selection.py).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings, strategies as st

import durable_agent.backends as reference  # the public codec: the pure kernels in this run
from durable_agent import NATIVE, ApprovalSigner, ToolApprovalRequest

pytestmark = pytest.mark.host_only("needs the native extension")

if sys.platform == "emscripten":
    pytest.skip("host only: the native extension does not exist under Pyodide", allow_module_level=True)
if NATIVE or os.environ.get("DURABLE_AGENT_NATIVE", "auto") != "0":
    pytest.skip("runs with DURABLE_AGENT_NATIVE=0, where the public codec is the pure reference",
                allow_module_level=True)
try:
    import durable_agent_native as native
except ImportError:
    pytest.skip("the native extension is not installed (scripts/build-native)", allow_module_level=True)

from test_codec import strict_repr  # noqa: E402
from test_codec_hostile import LenLies, LyingStr, items_lie  # noqa: E402

PARITY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def outcome(fn: Any, *args: Any, message: bool = True) -> tuple[Any, ...]:
    try:
        result = fn(*args)
    except Exception as exc:  # noqa: BLE001 - the class is what we compare
        return ("error", type(exc), str(exc) if message else None)
    return ("ok", result if isinstance(result, (str, bytes)) or result is None else strict_repr(result))


# --- generated values ----------------------------------------------------------------------

surrogates = st.integers(0xD800, 0xDFFF).map(chr)
any_text = st.text(st.characters(codec="utf-8") | surrogates, max_size=12)
nice_text = st.text(max_size=12)
keys = st.sampled_from(["$bytes", "$esc", "a", "", "\u00e9", "\U0001f600"]) | nice_text | any_text
big_ints = (
    st.integers(-(10**40), 10**40)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, -(2**64)])
    # around the 4300-digit limit (built lazily: hypothesis cannot repr such ints)
    | st.tuples(st.integers(4298, 4301), st.sampled_from([1, -1]), st.integers(-1, 0)).map(
        lambda t: t[1] * 10 ** t[0] + t[2]
    )
)
floats = st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from(
    [0.0, -0.0, 1e16, 1e15, 1e-4, 1e-5, 5e-324, 1.7976931348623157e308, 0.1, 1 / 3]
)
leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | big_ints
    | floats
    | nice_text
    | any_text
    | st.binary(max_size=20)
    | st.binary(max_size=8).map(bytearray)
    | st.binary(max_size=8).map(lambda b: memoryview(b))
    | st.sampled_from([frozenset(), object(), 1j, {1}])
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=5)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(keys, children, max_size=5)
        | st.tuples(st.sampled_from(["$bytes", "$esc"]), children).map(lambda kv: {kv[0]: kv[1]})
        | st.tuples(st.integers(0, 3) | st.none() | st.floats(0, 1), children).map(lambda kv: {kv[0]: kv[1]})
    )


values = st.recursive(leaves, _containers, max_leaves=30)


def _nest(args: tuple[int, list[str], Any]) -> Any:
    depth, wrappers, leaf = args
    value = leaf
    for i in range(depth):
        kind = wrappers[i % len(wrappers)]
        value = [value] if kind == "list" else {"$esc": value} if kind == "esc" else {"k": value}
    return value


deep_values = st.tuples(
    st.integers(240, 262),
    st.lists(st.sampled_from(["list", "dict", "esc"]), min_size=1, max_size=4),
    st.sampled_from([1, [], {}, b"", {"$bytes": 1}, {"$esc": {}}, "s", {1}]),
).map(_nest)


@PARITY
@given(values)
@example({"$bytes": b"\x00"})
@example({"$esc": {"$bytes": "AA=="}})
@example(["\ud800", {1}])
def test_encode_parity(value: Any) -> None:
    pure = outcome(reference.encode, value)
    assert outcome(native.encode, value) == pure
    if pure[0] == "ok":
        assert outcome(native.decode, pure[1], message=False) == outcome(reference.decode, pure[1], message=False)


@settings(max_examples=150, deadline=None)
@given(deep_values)
def test_deep_nesting_parity(value: Any) -> None:
    pure = outcome(reference.encode, value)
    assert outcome(native.encode, value) == pure
    if pure[0] == "ok":
        assert outcome(native.decode, pure[1], message=False) == outcome(reference.decode, pure[1], message=False)


# --- user objects that lie (docs/codec.md, "User objects") ---------------------------------

lying_keys = keys | keys.map(LyingStr)
not_pairs = st.sampled_from([("x",), ("a", 1, 2), ["k", 1], None])


def _lying_containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    pairs = st.lists(st.tuples(lying_keys, children), max_size=4)
    return (
        _containers(children)
        | st.dictionaries(lying_keys, children, max_size=4)
        | st.dictionaries(keys, children, max_size=4).map(LenLies)
        | st.tuples(pairs, st.lists(not_pairs, max_size=1)).map(lambda t: items_lie(t[0] + t[1]))
    )


lying_values = st.recursive(leaves | any_text.map(LyingStr), _lying_containers, max_leaves=20)


@PARITY
@given(lying_values)
@example({LyingStr("$esc"): {}})
@example(items_lie([("a", 1), (LyingStr("a"), 2)]))
def test_encode_parity_on_lying_user_objects(value: Any) -> None:
    pure = outcome(reference.encode, value)
    assert outcome(native.encode, value) == pure
    if pure[0] == "ok":
        assert outcome(native.decode, LyingStr(pure[1]), message=False) == outcome(
            reference.decode, pure[1], message=False
        )


# --- malformed and mutated text ------------------------------------------------------------

JSONISH = [
    *'{}[]",:\\ \t\n0123456789-+.eEtrufalsn$bytesc=/AZaz',
    "\\u",
    "\\ud800",
    "\\udc00",
    "\ud800",
    "\u00e9",
]
pieces = st.sampled_from(
    [
        *JSONISH,
        '{"$bytes":',
        '{"$esc":',
        '"AA=="',
        '"Zg="',
        '"Zh=="',
        '"A"',
        "true",
        "null",
        "1e400",
        "NaN",
        "-Infinity",
        "1" * 30,
        '"\\ud83d\\ude00"',
        '{"a":1,"a":2}',
        "[" * 257,
        "]" * 257,
    ]
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    value = draw(values)
    try:
        text = reference.encode(value)
    except Exception:  # noqa: BLE001
        text = draw(st.text(max_size=20))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(text)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(pieces)
        if op == "insert":
            text = text[:at] + piece + text[at:]
        elif op == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 4)) :]
        else:
            text = text[:at] + piece + text[at + len(piece) :]
    return text


@PARITY
@given(mutated())
@example('{"$esc":{"$bytes":"!!"}}')
@example('{"$bytes":"Zh=="}')
@example('{"$bytes":{"$bytes":"AA=="}}')
@example("[1,]")
@example("\ufeff[]")
def test_decode_parity_on_mutated_text(text: str) -> None:
    assert outcome(native.decode, text, message=False) == outcome(reference.decode, text, message=False)


@PARITY
@given(st.lists(pieces, max_size=12).map("".join) | any_text)
def test_decode_parity_on_jsonish_noise(text: str) -> None:
    assert outcome(native.decode, text, message=False) == outcome(reference.decode, text, message=False)


@PARITY
@given(st.one_of(st.binary(max_size=10), st.none(), st.integers(), st.lists(st.text(max_size=3), max_size=2)))
def test_decode_parity_on_non_text(value: Any) -> None:
    assert outcome(native.decode, value) == outcome(reference.decode, value)


@PARITY
@given(st.binary(max_size=64))
def test_bytes_parity(raw: bytes) -> None:
    text = reference.encode({"d": raw})
    assert native.encode({"d": raw}) == text
    assert native.decode(text) == reference.decode(text) == {"d": raw}


# --- approval tokens: ApprovalSigner on the pure kernels against the extension's token kernels -------
#
# The pure token kernels are reached through `ApprovalSigner`, which signs with its secret as the
# key (docs/tokens.md): its tokens must be what the extension's `token_sign` writes, and its
# verdict on any token, genuine or edited, what the extension's `token_open` gives (a genuine
# token passes the signer's policy: fixed clock, no age limit, its own key id).

SECRET = b"parity secret: 0123456789abcdef-0123"
CLOCK_MS = 1_700_000_000_000
SIGNER = ApprovalSigner(SECRET, clock=lambda: CLOCK_MS)
B64URL = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
token_noise = st.sampled_from(
    [*B64URL, ".", "=", "+", "/", " ", "\n", "\u00e9", "\ud800", "v1.", "V1", ""]
)
json_leaves = st.none() | st.booleans() | st.integers() | st.integers(-(10**40), 10**40) | nice_text | st.binary(max_size=12) \
    | st.floats(allow_nan=False, allow_infinity=False)
requests = st.builds(
    ToolApprovalRequest,
    approval_id=nice_text.filter(bool),
    tool_call_id=nice_text.filter(bool),
    tool_name=nice_text.filter(bool),
    input=st.dictionaries(nice_text, st.recursive(json_leaves, lambda c: st.lists(c, max_size=3), max_leaves=6),
                          max_size=3),
)


def payload_text(token: str) -> str:
    import base64

    segment = token.split(".")[1]
    return base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)).decode("utf-8")


@st.composite
def mutated_tokens(draw: st.DrawFn) -> str:
    token = SIGNER.sign(draw(requests), run_id=draw(st.none() | nice_text.filter(bool)))
    for _ in range(draw(st.integers(0, 3))):
        at = draw(st.integers(0, len(token)))
        op = draw(st.sampled_from(["insert", "delete", "replace"]))
        piece = draw(token_noise)
        if op == "insert":
            token = token[:at] + piece + token[at:]
        elif op == "delete":
            token = token[:at] + token[at + draw(st.integers(1, 3)) :]
        else:
            token = token[:at] + piece + token[at + 1 :]
    return token


@PARITY
@given(requests, st.none() | nice_text.filter(bool))
def test_token_sign_parity(request: ToolApprovalRequest, run_id: str | None) -> None:
    token = SIGNER.sign(request, run_id=run_id)
    assert native.token_sign(SECRET, payload_text(token)) == token


@PARITY
@given(mutated_tokens())
@example("v1..")
@example("")
def test_token_verify_parity(token: str) -> None:
    assert SIGNER.verify(token) == native.token_open(token, SECRET)
