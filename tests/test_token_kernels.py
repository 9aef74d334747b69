"""The native extension's token kernels (`b64url_*`, `hmac_sha256`, `token_sign`, `token_verify`, `token_open`).

`durable_agent_native` is a package of its own, so its kernels are tested here directly, against
the vectors. The pure kernels are private: they meet the same vectors through `ApprovalSigner`
(tests/test_signing.py, run with each kernel), and test_codec_parity.py holds the two to each other.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from durable_agent import CodecError
from durable_agent.backends import decode

VECTORS: dict[str, Any] = decode((Path(__file__).parent / "vectors" / "tokens.json").read_text("utf-8"))
B64URL_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
KEY = b"k" * 32
# The `kernels` fixture returns a module: sharing it across the examples of one test is safe.
FIXTURE_OK = [HealthCheck.function_scoped_fixture]

pytestmark = pytest.mark.host_only("needs the native extension")

if sys.platform == "emscripten":
    pytest.skip("host only: the native extension does not exist under Pyodide", allow_module_level=True)


@pytest.fixture
def kernels() -> ModuleType:
    """The extension; in the pure-only run (DURABLE_AGENT_NATIVE=0) these tests skip."""
    if os.environ.get("DURABLE_AGENT_NATIVE", "auto") == "0":
        pytest.skip("native kernels disabled by DURABLE_AGENT_NATIVE=0")
    import durable_agent_native

    return durable_agent_native


def as_key(secret: str | bytes) -> bytes:
    return secret.encode("utf-8") if isinstance(secret, str) else secret


def reference_b64url_decode(text: str) -> bytes | None:
    """An independent statement of "canonical": decodes, and re-encoding gives the text back."""
    if len(text) % 4 == 1 or not re.fullmatch(r"[A-Za-z0-9_-]*", text, flags=re.ASCII):
        return None
    raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    return raw if base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii") == text else None


def reference_token(key: bytes, payload: str) -> str:
    """The documented format, written without the kernels (hmac.new instead of hmac.digest)."""
    body = "v1." + base64.urlsafe_b64encode(payload.encode("utf-8")).rstrip(b"=").decode("ascii")
    mac = hmac.new(key, body.encode("ascii"), hashlib.sha256).digest()
    return body + "." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


@pytest.mark.parametrize("case", VECTORS["hmac_sha256"], ids=lambda c: c["name"])
def test_hmac_sha256_matches_rfc_4231(kernels: ModuleType, case: dict[str, str]) -> None:
    mac = kernels.hmac_sha256(bytes.fromhex(case["key_hex"]), bytes.fromhex(case["data_hex"]))
    assert type(mac) is bytes
    assert mac.hex() == case["mac_hex"]


def test_the_rfc_vector_file_has_cases_1_to_4_6_and_7() -> None:
    names = [case["name"] for case in VECTORS["hmac_sha256"]]
    assert names == [f"RFC 4231 test case {n}" for n in (1, 2, 3, 4, 6, 7)]


@pytest.mark.parametrize("case", VECTORS["b64url"]["valid"], ids=lambda c: c["text"][:12] or "empty")
def test_b64url_round_trips_the_vectors(kernels: ModuleType, case: dict[str, str]) -> None:
    raw = bytes.fromhex(case["hex"])
    assert kernels.b64url_encode(raw) == case["text"]
    decoded = kernels.b64url_decode(case["text"])
    assert type(decoded) is bytes and decoded == raw


@pytest.mark.parametrize("text", VECTORS["b64url"]["invalid"], ids=repr)
def test_b64url_decode_refuses_non_canonical_text(kernels: ModuleType, text: str) -> None:
    assert reference_b64url_decode(text) is None  # the vector really is invalid
    assert kernels.b64url_decode(text) is None


@pytest.mark.parametrize("value", [b"AAAA", None, 4, ["AAAA"], bytearray(b"AAAA")], ids=repr)
def test_b64url_decode_of_a_non_str_is_none(kernels: ModuleType, value: object) -> None:
    assert kernels.b64url_decode(value) is None


@given(st.binary(max_size=200))
@settings(suppress_health_check=FIXTURE_OK, max_examples=300, deadline=None)
def test_b64url_round_trips_any_bytes(kernels: ModuleType, raw: bytes) -> None:
    text = kernels.b64url_encode(raw)
    assert text == base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")
    assert kernels.b64url_decode(text) == raw


@given(st.text(alphabet=st.sampled_from(B64URL_CHARS + "=+/. \n\x00é"), max_size=16) | st.text(max_size=16))
@settings(suppress_health_check=FIXTURE_OK, max_examples=500, deadline=None)
def test_b64url_decode_accepts_exactly_the_canonical_texts(kernels: ModuleType, text: str) -> None:
    assert kernels.b64url_decode(text) == reference_b64url_decode(text)


@pytest.mark.parametrize("case", VECTORS["signed"], ids=lambda c: c["name"])
def test_token_sign_reproduces_the_golden_tokens(kernels: ModuleType, case: dict[str, Any]) -> None:
    key = as_key(case["secret"])
    assert kernels.token_sign(key, case["payload_json"]) == case["token"]
    assert reference_token(key, case["payload_json"]) == case["token"]


@pytest.mark.parametrize("case", VECTORS["kernel_verify"], ids=lambda c: c["name"])
def test_token_verify_gives_the_vector_verdict(kernels: ModuleType, case: dict[str, Any]) -> None:
    assert kernels.token_verify(case["token"], as_key(case["secret"])) == case["expected"]


@pytest.mark.parametrize("token", [None, b"v1.e30.x", 1, ["v1"], {"v1": 1}], ids=repr)
def test_token_verify_of_a_non_str_is_none(kernels: ModuleType, token: object) -> None:
    assert kernels.token_verify(token, KEY) is None
    assert kernels.token_open(token, KEY) is None


@pytest.mark.parametrize("case", VECTORS["kernel_verify"], ids=lambda c: c["name"])
def test_token_open_is_the_decoded_vector_verdict(kernels: ModuleType, case: dict[str, Any]) -> None:
    try:
        expected = None if case["expected"] is None else decode(case["expected"])
    except CodecError:  # a genuine token whose payload is not JSON
        expected = None
    assert kernels.token_open(case["token"], as_key(case["secret"])) == expected


@pytest.mark.parametrize(
    "payload", ['{"a":', "not json", "null", '{"a":1,"a":2}', '{"$bytes":"!"}', "[" * 2000 + "]" * 2000]
)
def test_token_open_of_a_genuine_token_whose_payload_does_not_decode_is_none(
    kernels: ModuleType, payload: str
) -> None:
    assert kernels.token_verify(kernels.token_sign(KEY, payload), KEY) == payload
    assert kernels.token_open(kernels.token_sign(KEY, payload), KEY) is None


def test_token_open_gives_fresh_containers_and_typed_values(kernels: ModuleType) -> None:
    value = {"input": {"data": b"\x00\xff", "n": 10**30, "x": 1.5, "ok": True, "list": [None, "é"]}}
    token = kernels.token_sign(KEY, kernels.encode(value))
    first, second = kernels.token_open(token, KEY), kernels.token_open(token, KEY)
    assert first == second == value
    first["input"]["list"].append(1)
    assert second == value
    assert kernels.token_open(token, KEY + b"x") is None


@pytest.mark.parametrize(
    "call",
    [
        lambda k: k.hmac_sha256("key", b"msg"),
        lambda k: k.hmac_sha256(b"key", "msg"),
        lambda k: k.b64url_encode("text"),
        lambda k: k.token_sign("key", "{}"),
        lambda k: k.token_sign(KEY, b"{}"),
        lambda k: k.token_verify("v1.e30.x", "key"),
        lambda k: k.token_open("v1.e30.x", "key"),
    ],
    ids=[
        "hmac str key",
        "hmac str message",
        "encode str",
        "sign str key",
        "sign bytes payload",
        "verify str key",
        "open str key",
    ],
)
def test_arguments_of_the_wrong_type_raise_type_error(kernels: ModuleType, call: Any) -> None:
    with pytest.raises(TypeError):
        call(kernels)


def test_token_sign_refuses_a_payload_with_a_lone_surrogate(kernels: ModuleType) -> None:
    with pytest.raises(UnicodeEncodeError):
        kernels.token_sign(KEY, '{"a":"\ud800"}')


@given(payload=st.text(max_size=200), key=st.binary(min_size=1, max_size=80))
@settings(suppress_health_check=FIXTURE_OK, max_examples=200, deadline=None)
def test_token_verify_opens_what_token_sign_seals(kernels: ModuleType, payload: str, key: bytes) -> None:
    token = kernels.token_sign(key, payload)
    assert token == reference_token(key, payload)
    assert kernels.token_verify(token, key) == payload
    assert kernels.token_verify(token, key + b"x") is None


@given(
    payload=st.text(max_size=60),
    position=st.integers(min_value=0),
    replacement=st.text(alphabet=st.sampled_from(B64URL_CHARS + ".=+/ é\n"), max_size=3),
    cut=st.integers(min_value=0, max_value=3),
)
@settings(suppress_health_check=FIXTURE_OK, max_examples=500, deadline=None)
def test_token_verify_refuses_any_edit_of_a_token(
    kernels: ModuleType, payload: str, position: int, replacement: str, cut: int
) -> None:
    token = kernels.token_sign(KEY, payload)
    i = position % (len(token) + 1)
    mutated = token[:i] + replacement + token[i + cut :]
    if mutated != token:
        assert kernels.token_verify(mutated, KEY) is None
