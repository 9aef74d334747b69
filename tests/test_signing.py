"""`ApprovalSigner`: the token format, verification policy, key rotation, and the attack table."""

from __future__ import annotations

import base64
import hashlib
import hmac
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings, strategies as st

from durable_agent import (
    APPROVAL_TOKEN_DENIED_REASON,
    ApprovalSigner,
    ApprovalSigningError,
    CodecError,
    ConfigurationError,
    ToolApprovalRequest,
    payload_matches_call,
)
from durable_agent.backends import decode, encode
from helpers import wall_clock_ms

VECTORS: dict[str, Any] = decode((Path(__file__).parent / "vectors" / "tokens.json").read_text("utf-8"))
SECRET = "test secret, long enough to be safe: 0123456789"
OLD_SECRET = "an older secret, also long enough: 9876543210"
T0 = 1_700_000_000_000
REQUEST = ToolApprovalRequest(
    approval_id="appr_1",
    tool_call_id="call_1",
    tool_name="write_file",
    input={"path": "/tmp/report.md", "content": "hello", "mode": 0o644},
)
HOUR = 3_600_000


class Clock:
    """A settable clock in epoch milliseconds."""

    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


def key_id_for(secret: str | bytes | bytearray) -> str:
    """The key id a signer holding `secret` writes in its tokens (docs/tokens.md derives it)."""
    return ApprovalSigner(secret).key_id


def forge(key: bytes, payload: str) -> str:
    """A token with a genuine MAC over any `payload` text, built as docs/tokens.md writes one (what a holder of
    the secret could send): ``v1.`` + base64url(payload), a dot, base64url(HMAC-SHA256(key, what precedes it))."""
    body = "v1." + b64url(payload.encode("utf-8"))
    return body + "." + b64url(hmac.digest(key, body.encode("ascii"), "sha256"))


def test_forge_writes_the_tokens_a_signer_writes() -> None:
    token = ApprovalSigner(SECRET, clock=lambda: T0).sign(REQUEST)
    assert forge(SECRET.encode(), encode(payload_of(token))) == token


def payload_of(token: str) -> dict[str, Any]:
    """Decode a token's payload without checking anything (what any client can do)."""
    segment = token.split(".")[1]
    return decode(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)).decode("utf-8"))  # type: ignore[no-any-return]


def make_signer(secret: str | bytes = SECRET, **options: Any) -> ApprovalSigner:
    options.setdefault("clock", Clock())
    return ApprovalSigner(secret, **options)


# --- the canonical format, pinned by the golden vectors ---------------------------------------


@pytest.mark.parametrize("case", VECTORS["signed"], ids=lambda c: c["name"])
def test_sign_reproduces_the_golden_token(case: dict[str, Any]) -> None:
    signer = ApprovalSigner(case["secret"], clock=lambda: case["clock_ms"])
    request = ToolApprovalRequest.from_dict(case["request"])
    assert signer.sign(request, run_id=case["run_id"]) == case["token"]


@pytest.mark.parametrize("case", VECTORS["signed"], ids=lambda c: c["name"])
def test_golden_payload_is_the_documented_dict_in_the_documented_order(case: dict[str, Any]) -> None:
    request = case["request"]
    expected: dict[str, Any] = {name: request[name] for name in ("approval_id", "tool_call_id", "tool_name")}
    expected["input"] = request["input"]
    if "agent_path" in request:
        expected["agent_path"] = request["agent_path"]
    if case["run_id"] is not None:
        expected["run_id"] = case["run_id"]
    expected["issued_at"] = case["clock_ms"]
    expected["kid"] = case["kid"]
    assert case["payload_json"] == encode(expected)
    assert payload_of(case["token"]) == expected == case["payload"]


@pytest.mark.parametrize("case", VECTORS["keys"], ids=lambda c: c["name"])
def test_key_id_is_derived_from_the_secret_as_documented(case: dict[str, Any]) -> None:
    secret = case["secret"]
    raw = secret.encode("utf-8") if isinstance(secret, str) else secret
    assert b64url(hashlib.sha256(b"durable-agent kid\x00" + raw).digest())[:8] == case["kid"]
    assert key_id_for(secret) == case["kid"]
    assert ApprovalSigner(secret).key_id == case["kid"]


@pytest.mark.parametrize("case", VECTORS["verify"], ids=lambda c: c["name"])
def test_verify_gives_the_vector_verdict(case: dict[str, Any]) -> None:
    options = {"max_token_length": case["max_token_length"]} if "max_token_length" in case else {}
    signer = ApprovalSigner(
        case["secrets"][0], previous_secrets=case["secrets"][1:], clock=lambda: case["now_ms"], **options
    )
    assert signer.verify(case["token"], max_age_ms=case["max_age_ms"]) == case["expected"]


def test_sign_ignores_the_request_token_field_and_accepts_a_mapping() -> None:
    signer = make_signer()
    with_token = ToolApprovalRequest("appr_1", "call_1", "write_file", REQUEST.input, token="v1.stale.token")
    assert signer.sign(with_token) == signer.sign(REQUEST) == signer.sign(REQUEST.to_dict())


def test_verify_returns_the_exact_request_signed() -> None:
    request = ToolApprovalRequest(
        "a", "c", "t", {"blob": b"\x00\xff", "n": [1, 2.5]}, agent_path=("outer", "inner")
    )
    payload = make_signer().verify(make_signer().sign(request, run_id="run-7"))
    assert payload == {
        "approval_id": "a",
        "tool_call_id": "c",
        "tool_name": "t",
        "input": {"blob": b"\x00\xff", "n": [1, 2.5]},
        "agent_path": ["outer", "inner"],
        "run_id": "run-7",
        "issued_at": T0,
        "kid": key_id_for(SECRET),
    }


def test_the_default_clock_is_the_wall_clock_in_milliseconds() -> None:
    signer = ApprovalSigner(SECRET)
    before = time.time_ns() // 1_000_000
    issued = payload_of(signer.sign(REQUEST))["issued_at"]
    after = wall_clock_ms()
    assert type(issued) is int and before <= issued <= after


def test_verify_without_max_age_never_reads_the_clock() -> None:
    clock = Clock()
    signer = ApprovalSigner(SECRET, clock=clock)
    token = signer.sign(REQUEST)

    def broken() -> int:
        raise AssertionError("clock read")

    assert ApprovalSigner(SECRET, clock=broken).verify(token) is not None


# --- expiry --------------------------------------------------------------------------------


def test_a_token_expires_when_its_age_reaches_max_age() -> None:
    clock = Clock()
    signer = make_signer(clock=clock)
    token = signer.sign(REQUEST)
    clock.now = T0 + HOUR - 1
    assert signer.verify(token, max_age_ms=HOUR) is not None
    clock.now = T0 + HOUR
    assert signer.verify(token, max_age_ms=HOUR) is None
    assert signer.verify(token) is not None  # no max age: no expiry


def test_a_token_from_the_future_is_accepted_only_within_the_skew_allowance() -> None:
    clock = Clock()
    signer = make_signer(clock=clock, max_clock_skew_ms=5_000)
    token = signer.sign(REQUEST)
    clock.now = T0 - 5_000
    assert signer.verify(token, max_age_ms=HOUR) is not None
    clock.now = T0 - 5_001
    assert signer.verify(token, max_age_ms=HOUR) is None


@pytest.mark.parametrize("bad", [-1, 1.5, True, "60000", float("nan")], ids=repr)
def test_a_bad_max_age_is_a_configuration_error(bad: object) -> None:
    signer = make_signer()
    token = signer.sign(REQUEST)
    with pytest.raises(ConfigurationError, match="max_age_ms"):
        signer.verify(token, max_age_ms=bad)  # type: ignore[arg-type]
    assert signer.verify(token, max_age_ms=None) is not None
    signer.verify(token, max_age_ms=0)  # zero is a valid age limit (no ConfigurationError)


@pytest.mark.parametrize("value", [1.7e12, None, "now"], ids=repr)
def test_a_clock_returning_a_non_int_is_a_configuration_error(value: object) -> None:
    signer = ApprovalSigner(SECRET, clock=lambda: value)  # type: ignore[arg-type, return-value]
    with pytest.raises(ConfigurationError, match="clock"):
        signer.sign(REQUEST)
    token = make_signer().sign(REQUEST)
    with pytest.raises(ConfigurationError, match="clock"):
        signer.verify(token, max_age_ms=HOUR)


# --- secrets and rotation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "secret",
    ["", "short", "x" * 31, b"\x00" * 31, "é" * 15 + "a"],  # the last is 31 UTF-8 bytes
    ids=["empty", "short", "31 chars", "31 bytes", "31 utf-8 bytes"],
)
def test_a_secret_under_32_bytes_is_refused(secret: str | bytes) -> None:
    with pytest.raises(ConfigurationError, match="at least 32"):
        ApprovalSigner(secret)


def test_a_32_byte_secret_is_accepted_whether_str_bytes_or_multibyte() -> None:
    assert ApprovalSigner("x" * 32).key_id == key_id_for(b"x" * 32)
    assert ApprovalSigner(bytearray(b"\xff" * 32)).key_id == key_id_for(b"\xff" * 32)
    assert ApprovalSigner("é" * 16).key_id == key_id_for("é".encode() * 16)


@pytest.mark.parametrize(
    "secret", [None, 12345, ["x" * 32], "\ud800" * 40], ids=["None", "int", "list", "surrogate"]
)
def test_a_secret_of_the_wrong_kind_is_refused(secret: object) -> None:
    with pytest.raises(ConfigurationError, match="secret"):
        ApprovalSigner(secret)  # type: ignore[arg-type]


def test_previous_secrets_are_checked_like_the_current_one() -> None:
    with pytest.raises(ConfigurationError, match=r"previous_secrets\[1\].*at least 32"):
        ApprovalSigner(SECRET, previous_secrets=[OLD_SECRET, "too short"])
    with pytest.raises(ConfigurationError, match="single secret"):
        ApprovalSigner(SECRET, previous_secrets=OLD_SECRET)  # a str is an iterable: refused
    with pytest.raises(ConfigurationError, match="listed twice"):
        ApprovalSigner(SECRET, previous_secrets=[OLD_SECRET, SECRET.encode()])


def test_rotation_signs_with_the_current_key_and_accepts_listed_previous_keys() -> None:
    old = make_signer(OLD_SECRET)
    rotated = make_signer(SECRET, previous_secrets=[OLD_SECRET])
    assert rotated.key_ids == (key_id_for(SECRET), key_id_for(OLD_SECRET))
    old_token = old.sign(REQUEST)
    assert rotated.verify(old_token) == old.verify(old_token)
    new_token = rotated.sign(REQUEST)
    assert payload_of(new_token)["kid"] == rotated.key_id == key_id_for(SECRET)
    assert make_signer(SECRET).verify(new_token) is not None
    assert old.verify(new_token) is None
    assert make_signer(SECRET).verify(old_token) is None  # retired: no longer listed


def test_repr_names_key_ids_and_never_the_secret() -> None:
    text = repr(make_signer(SECRET, previous_secrets=[OLD_SECRET]))
    assert key_id_for(SECRET) in text and key_id_for(OLD_SECRET) in text
    assert SECRET not in text and OLD_SECRET not in text and "test secret" not in text


@pytest.mark.parametrize(
    "options",
    [{"clock": 5}, {"max_token_length": -1}, {"max_token_length": 1.5}, {"max_clock_skew_ms": -5}],
    ids=repr,
)
def test_bad_signer_options_are_configuration_errors(options: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError):
        ApprovalSigner(SECRET, **options)


# --- what sign refuses ---------------------------------------------------------------------


def test_sign_refuses_malformed_requests_with_typed_errors() -> None:
    signer = make_signer()
    with pytest.raises(TypeError, match="ToolApprovalRequest"):
        signer.sign("appr_1")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_id"):
        signer.sign(REQUEST, run_id=42)  # type: ignore[arg-type]
    with pytest.raises(ApprovalSigningError, match="approval_id"):
        signer.sign(ToolApprovalRequest(7, "c", "t", {}))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="agent_path"):  # refused when the request is built
        ToolApprovalRequest("a", "c", "t", {}, agent_path="outer")  # type: ignore[arg-type]
    with pytest.raises(ApprovalSigningError, match="agent_path"):
        signer.sign({**REQUEST.to_dict(), "agent_path": "outer"})
    with pytest.raises(ApprovalSigningError, match="unknown fields"):
        signer.sign({**REQUEST.to_dict(), "run_id": "run-1"})
    with pytest.raises(ApprovalSigningError, match="'input' is missing"):
        signer.sign({"approval_id": "a", "tool_call_id": "c", "tool_name": "t"})
    with pytest.raises(CodecError):
        signer.sign(ToolApprovalRequest("a", "c", "t", {"s": {1, 2}}))


def test_sign_refuses_to_mint_a_token_verify_would_reject_for_length() -> None:
    signer = make_signer(max_token_length=400)
    small = signer.sign(ToolApprovalRequest("a", "c", "t", "x" * 10))
    assert len(small) <= 400 and signer.verify(small) is not None
    with pytest.raises(ApprovalSigningError, match="max_token_length"):
        signer.sign(ToolApprovalRequest("a", "c", "t", "x" * 400))


def test_the_default_length_cap_refuses_oversized_tokens() -> None:
    signer = make_signer()
    with pytest.raises(ApprovalSigningError):
        signer.sign(ToolApprovalRequest("a", "c", "t", "x" * 64 * 1024))
    huge = make_signer(max_token_length=10**6).sign(ToolApprovalRequest("a", "c", "t", "x" * 64 * 1024))
    assert make_signer(max_token_length=10**6).verify(huge) is not None
    assert signer.verify(huge) is None


@pytest.mark.parametrize("token", [None, b"v1.x.y", 12, ["v1"], object()], ids=repr)
def test_verify_of_a_non_str_is_none(token: object) -> None:
    assert make_signer().verify(token) is None
    assert not make_signer().check_approval(
        token, approval_id="appr_1", tool_call_id="call_1", tool_name="write_file", input=REQUEST.input
    )


# --- check_approval and the attack table ---------------------------------------------------


def check(signer: ApprovalSigner, token: object, **overrides: Any) -> bool:
    call: dict[str, Any] = {
        "approval_id": REQUEST.approval_id,
        "tool_call_id": REQUEST.tool_call_id,
        "tool_name": REQUEST.tool_name,
        "input": REQUEST.input,
        "run_id": "run-A",
        "max_age_ms": HOUR,
    }
    call.update(overrides)
    return signer.check_approval(token, **call)


def test_check_approval_accepts_the_genuine_token_for_its_call() -> None:
    signer = make_signer()
    assert check(signer, signer.sign(REQUEST, run_id="run-A"))


def reencoded(token: str, **changes: Any) -> str:
    """The token with its payload edited and re-encoded, the original MAC kept (a tampering client)."""
    payload = {**payload_of(token), **changes}
    return "v1." + b64url(encode(payload).encode("utf-8")) + "." + token.rsplit(".", 1)[1]


def flip(char: str) -> str:
    return "B" if char == "A" else "A"


ATTACKS: dict[str, Callable[[str, Clock], tuple[str | None, dict[str, Any]]]] = {
    "forged MAC": lambda t, c: (t[:-10] + "A" * 10, {}),
    "MAC from another secret": lambda t, c: (
        ApprovalSigner("an attacker's guess at the secret......", clock=c).sign(REQUEST, run_id="run-A"),
        {},
    ),
    "hand-crafted token, no MAC": lambda t, c: ("v1." + b64url(encode(payload_of(t)).encode()) + ".", {}),
    "token from another run": lambda t, c: (t, {"run_id": "run-B"}),
    "token for another approval id": lambda t, c: (t, {"approval_id": "appr_2"}),
    "token for another tool call id": lambda t, c: (t, {"tool_call_id": "call_2"}),
    "token for another tool": lambda t, c: (t, {"tool_name": "delete_file"}),
    "same tool, different input": lambda t, c: (t, {"input": {**REQUEST.input, "path": "/etc/passwd"}}),
    "same tool, input with a float for an int": lambda t, c: (t, {"input": {**REQUEST.input, "mode": 420.0}}),
    "same tool, input with an extra field": lambda t, c: (t, {"input": {**REQUEST.input, "x": None}}),
    "replay after max age": lambda t, c: (setattr(c, "now", T0 + HOUR) or t, {}),  # type: ignore[func-returns-value]
    "input swapped inside a re-encoded payload": lambda t, c: (
        reencoded(t, input={"path": "/etc/passwd"}),
        {},
    ),
    "run id swapped inside a re-encoded payload": lambda t, c: (
        reencoded(t, run_id="run-B"),
        {"run_id": "run-B"},
    ),
    "issued_at refreshed inside a re-encoded payload": lambda t, c: (
        setattr(c, "now", T0 + 2 * HOUR) or reencoded(t, issued_at=T0 + 2 * HOUR),  # type: ignore[func-returns-value]
        {},
    ),
    "truncated token": lambda t, c: (t[: len(t) // 2], {}),
    "token missing its last character": lambda t, c: (t[:-1], {}),
    "garbled payload": lambda t, c: (t[:5] + flip(t[5]) + t[6:], {}),
    "garbled MAC": lambda t, c: (t[:-5] + flip(t[-5]) + t[-4:], {}),
    "wrong version": lambda t, c: ("v2" + t[2:], {}),
    "padded payload": lambda t, c: (t.replace(".", "=.", 2).replace("=.", ".", 1), {}),
    "token signed with a retired key no longer listed": lambda t, c: (
        ApprovalSigner(OLD_SECRET, clock=c).sign(REQUEST, run_id="run-A"),
        {},
    ),
    "missing token": lambda t, c: (None, {}),
    "empty token": lambda t, c: ("", {}),
    "token with whitespace": lambda t, c: (t + " ", {}),
}


@pytest.mark.parametrize("attack", list(ATTACKS), ids=list(ATTACKS))
def test_every_attack_in_the_table_is_denied(attack: str) -> None:
    clock = Clock()
    signer = ApprovalSigner(SECRET, clock=clock)  # OLD_SECRET is retired: not listed
    genuine = signer.sign(REQUEST, run_id="run-A")
    assert check(signer, genuine)  # the attack starts from a token that works
    token, overrides = ATTACKS[attack](genuine, clock)
    assert not check(signer, token, **overrides)


def test_run_binding_applies_only_when_both_sides_have_a_run_id() -> None:
    signer = make_signer()
    unbound = signer.sign(REQUEST)
    bound = signer.sign(REQUEST, run_id="run-A")
    assert check(signer, unbound, run_id="run-A")
    assert check(signer, bound, run_id=None)
    assert not check(signer, bound, run_id="run-B")
    assert check(signer, signer.sign(REQUEST, run_id=""), run_id="")
    assert not check(signer, signer.sign(REQUEST, run_id=""), run_id="run-A")


def test_input_comparison_is_typed_but_ignores_key_order_and_sequence_kind() -> None:
    signer = make_signer()
    request = ToolApprovalRequest("a", "c", "t", {"b": [1, (2, 3)], "a": b"\x01", "n": {"y": 1, "x": True}})
    token = signer.sign(request)
    same = {"n": {"x": True, "y": 1}, "a": bytearray(b"\x01"), "b": ((1, [2, 3]))}
    assert signer.check_approval(token, approval_id="a", tool_call_id="c", tool_name="t", input=same)
    for other in (
        {"b": [1, [2, 3]], "a": "AQ==", "n": {"y": 1, "x": True}},  # str is not bytes
        {"b": [1, [2, 3]], "a": b"\x01", "n": {"y": 1, "x": 1}},  # 1 is not True
        {"b": [1, [2, 3]], "a": b"\x01", "n": {"y": 1.0, "x": True}},  # 1.0 is not 1
        {"b": [1, [2, 3]], "a": b"\x01", "n": {"y": 1, "x": True, "z": None}},
        {"b": [1, [2, 3]], "a": b"\x01", "n": {"y": 1, "x": True}, 5: "non-str key"},
        {"b": [1, [2, 3]], "a": b"\x01", "n": {"y": 1, "x": {1, 2}}},  # not encodable
    ):
        assert not signer.check_approval(token, approval_id="a", tool_call_id="c", tool_name="t", input=other)


def test_the_denial_reason_is_the_documented_sentence() -> None:
    assert (
        APPROVAL_TOKEN_DENIED_REASON == "Approval token missing, invalid, expired, or bound to another run."
    )


# --- properties ----------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
    | st.binary(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(st.text(max_size=300) | st.text(alphabet="v1.-_ABCxyz09=", max_size=120))
@settings(max_examples=500, deadline=None)
def test_verify_never_raises_and_never_accepts_random_text(text: str) -> None:
    signer = make_signer()
    assert signer.verify(text) is None
    assert signer.verify(text, max_age_ms=HOUR) is None


@given(
    position=st.integers(min_value=0),
    replacement=st.text(alphabet="ABCabc019-_.=+/ \né", max_size=4) | st.text(max_size=2),
    cut=st.integers(min_value=0, max_value=6),
    run_id=st.none() | st.text(max_size=10),
)
@settings(max_examples=500, deadline=None)
def test_verify_never_accepts_a_mutated_token(
    position: int, replacement: str, cut: int, run_id: str | None
) -> None:
    signer = make_signer()
    token = signer.sign(REQUEST, run_id=run_id)
    i = position % (len(token) + 1)
    mutated = token[:i] + replacement + token[i + cut :]
    if mutated != token:
        assert signer.verify(mutated) is None


@given(
    ids=st.tuples(st.text(max_size=20), st.text(max_size=20), st.text(max_size=20)),
    value=json_values,
    agent_path=st.none() | st.lists(st.text(max_size=5), max_size=3).map(tuple),
    run_id=st.none() | st.text(max_size=20),
    issued_at=st.integers(min_value=-(2**63), max_value=2**63),
)
@settings(max_examples=200, deadline=None)
def test_any_signed_request_verifies_to_itself_and_checks_out(
    ids: tuple[str, str, str],
    value: Any,
    agent_path: tuple[str, ...] | None,
    run_id: str | None,
    issued_at: int,
) -> None:
    signer = make_signer(clock=Clock(issued_at))
    request = ToolApprovalRequest(*ids, value, agent_path=agent_path)
    try:
        token = signer.sign(request, run_id=run_id)
    except CodecError:  # deeper than the codec allows, or a lone surrogate: refused, typed
        return
    payload = signer.verify(token, max_age_ms=1)
    assert payload is not None
    expected = {**request.to_dict(), **({"run_id": run_id} if run_id is not None else {})}
    assert list(payload) == [*expected, "issued_at", "kid"]
    assert encode({k: payload[k] for k in expected}) == encode(expected)
    assert payload["issued_at"] == issued_at
    assert signer.check_approval(
        token,
        approval_id=ids[0],
        tool_call_id=ids[1],
        tool_name=ids[2],
        input=value,
        run_id=run_id,
        max_age_ms=1,
    )


# --- import hygiene ------------------------------------------------------------------------


@pytest.mark.host_only("runs a subprocess")
def test_importing_the_package_touches_no_entropy_and_nothing_outside_the_stdlib() -> None:
    """The signer's secrets never come from entropy drawn at import (nor does anything else of the package)."""
    script = """
import os, sys, secrets, random, uuid
def boom(*a, **k): raise RuntimeError("entropy touched at import")
os.urandom = boom; secrets.token_bytes = boom; uuid.uuid4 = boom; random.seed = boom
before = set(sys.modules)
import durable_agent
outside = sorted(
    name for name in set(sys.modules) - before
    if name.split(".")[0] not in sys.stdlib_module_names and name.split(".")[0] != "durable_agent"
)
print(outside)
"""
    env = {"DURABLE_AGENT_NATIVE": "0", "PYTHONPATH": str(Path(__file__).resolve().parent.parent / "python")}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == "[]"


def test_the_worked_example_in_the_docs_is_the_run_bound_vector() -> None:
    docs = (Path(__file__).resolve().parent.parent / "docs" / "tokens.md").read_text("utf-8")
    case = next(c for c in VECTORS["signed"] if c["name"] == "run-bound")
    assert f"payload_json = {case['payload_json']}\n" in docs
    assert f"`{case['clock_ms']}`" in docs and f"`{case['secret']}`" in docs


def test_payload_matches_call_is_usable_with_any_verify_result() -> None:
    signer = make_signer()
    payload = signer.verify(signer.sign(REQUEST, run_id="run-A"))
    call: dict[str, Any] = {
        "approval_id": "appr_1",
        "tool_call_id": "call_1",
        "tool_name": "write_file",
        "input": REQUEST.input,
        "run_id": "run-A",
    }
    assert payload_matches_call(payload, **call)
    assert not payload_matches_call(payload, **{**call, "run_id": "run-B"})
    assert not payload_matches_call(payload, **{**call, "input": {}})
    assert payload is not None
    for broken in (
        None,
        "payload",
        [payload],
        {k: v for k, v in payload.items() if k != "input"},
        {k: v for k, v in payload.items() if k != "approval_id"},
        {**payload, "tool_name": ["write_file"]},
    ):
        assert not payload_matches_call(broken, **call)


def test_with_clock_keeps_the_keys_and_signs_and_judges_age_on_the_given_clock() -> None:
    old = ApprovalSigner(SECRET, previous_secrets=[OLD_SECRET], max_token_length=4096)
    clock = Clock()
    twin = old.with_clock(clock)
    request = ToolApprovalRequest("a1", "c1", "pay", {"id": 7})
    first, again = twin.sign(request, run_id="r"), twin.sign(request, run_id="r")
    assert first == again  # same clock reading, same token: what a replay needs
    assert twin.key_ids == old.key_ids and old.verify(first) is not None
    assert twin.verify(first)["issued_at"] == clock.now  # type: ignore[index]
    clock.now += 5_000
    assert twin.verify(first, max_age_ms=5_000) is None and twin.verify(first, max_age_ms=5_001) is not None
    with pytest.raises(ConfigurationError):
        old.with_clock(42)  # type: ignore[arg-type]


_GOOD_PAYLOAD: dict[str, Any] = {
    "approval_id": "a1",
    "tool_call_id": "c1",
    "tool_name": "delete",
    "input": {"path": "/tmp/x"},
    "issued_at": T0,
}


@pytest.mark.parametrize(
    ("change", "accepted"),
    [
        ({}, True),
        ({"run_id": "r1"}, True),
        ({"run_id": "r1", "agent_path": ["outer", "inner"]}, True),
        ({"input": None}, True),
        ({"run_id": 7}, False),
        ({"agent_path": "outer"}, False),
        ({"agent_path": ["outer", 1]}, False),
        ({"issued_at": True}, False),
        ({"issued_at": 1.5}, False),
        ({"tool_name": None}, False),
        ({"extra": 1}, False),
        ({"kid": "someone"}, False),
    ],
)
def test_verify_accepts_exactly_the_payload_fields_and_types_sign_writes(
    change: dict[str, Any], accepted: bool
) -> None:
    """A genuine MAC over a payload sign would not write is refused (the policy, not the kernel)."""
    signer = ApprovalSigner(SECRET, clock=lambda: T0)
    payload = {**_GOOD_PAYLOAD, "kid": signer.key_id, **change}
    token = forge(SECRET.encode(), encode(payload))
    assert (signer.verify(token, max_age_ms=1000) == payload) is accepted


@pytest.mark.parametrize("missing", [*sorted(_GOOD_PAYLOAD), "kid"])
def test_verify_refuses_a_genuine_payload_missing_a_field(missing: str) -> None:
    signer = ApprovalSigner(SECRET, clock=lambda: T0)
    payload = {**_GOOD_PAYLOAD, "kid": signer.key_id}
    del payload[missing]
    assert signer.verify(forge(SECRET.encode(), encode(payload))) is None
