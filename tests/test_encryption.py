"""Encryption at rest: the keyring, the envelope and its vectors (docs/encryption.md).

Every implementation runs the same vectors (tests/vectors/encryption.json): `cryptography` on CPython and,
when Pyodide can load it, under Pyodide; WebCrypto (``crypto.subtle``) under Pyodide. An envelope written
by one is read by the others because each must reproduce and open exactly the same envelopes.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import secrets
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, cast

import pytest
from hypothesis import given, settings, strategies as st

import durable_agent
from durable_agent import (
    AgentCheckpoint,
    CodecError,
    ConfigurationError,
    DecryptionError,
    FeatureUnavailableError,
    ToolApprovalRequest,
    Usage,
)
from durable_agent.encryption import Keyring, associated_data, envelope_key_id, is_envelope

Implementation = Literal["cryptography", "webcrypto"]  # Keyring's `implementation=` (besides "auto")

ON_PYODIDE = sys.platform == "emscripten"
VECTORS = json.loads((Path(__file__).parent / "vectors" / "encryption.json").read_text(encoding="utf-8"))
KEYS = {key_id: bytes.fromhex(key) for key_id, key in VECTORS["keys"].items()}
K1, K2 = KEYS["k1"], KEYS["k2"]
PLACE = ("checkpoint-message", "run-42", 3)
Vector = dict[str, Any]
PROBLEMS = {
    "not_envelope": "not an envelope",
    "malformed": "malformed",
    "unknown_key": "not in this keyring",
    "not_authentic": "not authentic",
}
MARK = "zq" + secrets.token_hex(8)  # unique per session: only what a test stored can hold it


def marked(run_id: str, step_index: int) -> AgentCheckpoint:
    """A checkpoint whose every kind of stored data holds `MARK` (the stores' and runtimes' encryption tests):
    user text, a tool call's input, a tool result's output, assistant text, a pending approval's input and
    token, the agent path, the trace context."""
    messages: list[Any] = [
        {"role": "user", "content": f"user {MARK}"},
        {"role": "assistant", "content": [
            {"type": "text", "text": f"reply {MARK}"},
            {"type": "tool-call", "tool_call_id": "c1", "tool_name": "lookup", "input": {"q": f"in {MARK}"}},
        ]},
        {"role": "tool", "content": [
            {"type": "tool-result", "tool_call_id": "c1", "tool_name": "lookup", "output": {"v": f"out {MARK}"}},
        ]},
    ][: 2 + step_index]
    approval = ToolApprovalRequest("a1", "c2", "pay", {"to": f"payee {MARK}"}, ("outer", f"agent{MARK}"),
                                   token=f"v1.{MARK}")
    return AgentCheckpoint(run_id, step_index, "suspended", messages, Usage(1, 2, 3), 1_000, (approval,),
                           trace_context={"traceparent": f"00-{MARK}"})


CRYPTOGRAPHY_MISSING = (
    "cryptography is not importable: Pyodide ships its wheel only from its CDN (not in the npm package), "
    "and this run is offline"
)


def cryptography_available() -> bool:
    return importlib.util.find_spec("cryptography") is not None


def webcrypto_available() -> bool:
    """True under Pyodide when the JS ``crypto.subtle`` exists."""
    import js

    return getattr(getattr(js, "crypto", None), "subtle", None) is not None


def unusable(implementation: Implementation) -> str | None:
    """Why `implementation` cannot run here (None: it can). On CPython a missing `cryptography` fails."""
    if implementation == "cryptography":
        return CRYPTOGRAPHY_MISSING if ON_PYODIDE and not cryptography_available() else None
    if not ON_PYODIDE:
        return "WebCrypto is reached through Pyodide's JS bridge: it runs in the Pyodide suite"
    from pyodide.ffi import can_run_sync

    if not can_run_sync():
        return "awaiting JS promises needs stack switching (JSPI)"
    return None if webcrypto_available() else "this runtime has no crypto.subtle"


IMPLEMENTATIONS = ["cryptography", "webcrypto"]


def usable(request: Any) -> Implementation:
    """The implementation a fixture parametrized by `IMPLEMENTATIONS` asks for; the test skips where it cannot run."""
    reason = unusable(request.param)
    if reason is not None:
        pytest.skip(reason)
    return cast(Implementation, request.param)


@pytest.fixture(params=IMPLEMENTATIONS)
def implementation(request: Any) -> Implementation:
    """Each AES-GCM implementation, through the keyring's async pair (which both have)."""
    return usable(request)


NO_SYNC_PAIR = unusable("cryptography")
needs_sync_pair = pytest.mark.skipif(NO_SYNC_PAIR is not None, reason=str(NO_SYNC_PAIR))  # seal/open


def ring(implementation: Implementation = "cryptography", **kwargs: Any) -> Keyring:
    return Keyring({"k2": K2, "k1": K1}, primary="k2", implementation=implementation, **kwargs)


def plaintext_of(vector: Vector) -> str | bytes:
    value = vector["plaintext"]
    return value["text"] if "text" in value else bytes.fromhex(value["hex"])


def assert_names_no_key(error: BaseException) -> None:
    text = str(error)
    for key in KEYS.values():
        for shown in (key.hex(), base64.b64encode(key).decode(), base64.urlsafe_b64encode(key).decode()[:20]):
            assert shown not in text


# --- the shared vectors -----------------------------------------------------------------------------


@pytest.mark.skipif(NO_SYNC_PAIR is not None, reason=str(NO_SYNC_PAIR))
@pytest.mark.parametrize("vector", VECTORS["envelopes"], ids=lambda v: v["name"])
def test_an_envelope_is_aes_256_gcm_of_its_place_as_documented(vector: Vector) -> None:
    """Checked with the `cryptography` package's AESGCM directly, not through the keyring: the envelope's body is
    nonce || ciphertext || tag, sealed under its key with the header and `associated_data(place)` as associated
    data (docs/encryption.md). The envelope vectors hold both implementations to these texts (below)."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    form, key_id, body = vector["envelope"].split(".", 2)
    raw = base64.b64decode(body, validate=True)
    plaintext = plaintext_of(vector)
    header = f"{form}.{key_id}.".encode("ascii")
    opened = AESGCM(KEYS[key_id]).decrypt(raw[:12], raw[12:], header + associated_data(vector["place"]))
    assert form.startswith("enc1") and raw[:12].hex() == vector["nonce"]
    assert opened == (plaintext.encode() if isinstance(plaintext, str) else plaintext)


@pytest.mark.skipif(NO_SYNC_PAIR is not None, reason=str(NO_SYNC_PAIR))
@pytest.mark.parametrize("vector", VECTORS["aead"], ids=lambda v: v["name"])
def test_the_aes_gcm_that_checks_the_envelopes_meets_the_gcm_specification(vector: Vector) -> None:
    """The `aead` vectors (the GCM specification's test cases 13-16) through the `cryptography` package's AESGCM,
    which the envelope test above checks the envelopes with: so they rest on an outside reference."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    field = {name: bytes.fromhex(vector[name]) for name in ("key", "nonce", "aad", "plaintext", "sealed")}
    assert AESGCM(field["key"]).encrypt(field["nonce"], field["plaintext"], field["aad"]) == field["sealed"]


@pytest.mark.parametrize("vector", VECTORS["associated_data"], ids=lambda v: repr(v["place"]))
def test_associated_data_vectors(vector: Vector) -> None:
    assert associated_data(vector["place"]) == bytes.fromhex(vector["hex"])
    assert associated_data(tuple(vector["place"])) == bytes.fromhex(vector["hex"])


@pytest.mark.parametrize("vector", VECTORS["envelopes"], ids=lambda v: v["name"])
async def test_each_implementation_seals_the_vector_envelopes(
    implementation: Implementation, vector: Vector
) -> None:
    key_id, nonce = vector["key_id"], bytes.fromhex(vector["nonce"])
    keyring = Keyring({key_id: KEYS[key_id]}, primary=key_id, implementation=implementation,
                      nonce_source=lambda: nonce)
    plaintext, place, binary = plaintext_of(vector), vector["place"], bytes.fromhex(vector["binary"])
    assert await keyring.seal_async(plaintext, place) == vector["envelope"]
    assert await keyring.seal_async(plaintext, place, binary=True) == binary
    if implementation == "cryptography":
        assert keyring.seal(plaintext, place) == vector["envelope"]
        assert keyring.seal(plaintext, place, binary=True) == binary


@pytest.mark.parametrize("vector", VECTORS["envelopes"], ids=lambda v: v["name"])
async def test_each_implementation_opens_the_vector_envelopes(
    implementation: Implementation, vector: Vector
) -> None:
    keyring = Keyring(KEYS, primary="k2", implementation=implementation)
    binary = bytes.fromhex(vector["binary"])
    for stored in (vector["envelope"], binary, bytearray(binary), memoryview(binary)):
        opened = await keyring.open_async(stored, vector["place"])
        assert opened == plaintext_of(vector) and type(opened) is type(plaintext_of(vector))
        if implementation == "cryptography":
            assert keyring.open(stored, vector["place"]) == plaintext_of(vector)
        assert envelope_key_id(stored) == vector["key_id"] and is_envelope(stored)


@pytest.mark.parametrize("vector", VECTORS["refused"], ids=lambda v: v["name"])
async def test_each_implementation_refuses_the_tampered_values(
    implementation: Implementation, vector: Vector
) -> None:
    keyring = ring(implementation)
    with pytest.raises(DecryptionError) as caught:
        await keyring.open_async(vector["envelope"], vector["place"])
    assert PROBLEMS[vector["problem"]] in caught.value.problem
    assert caught.value.place == tuple(vector["place"]) and repr(tuple(vector["place"])) in str(caught.value)
    assert_names_no_key(caught.value)
    if implementation == "cryptography":
        with pytest.raises(DecryptionError, match=PROBLEMS[vector["problem"]]):
            keyring.open(vector["envelope"], vector["place"])


@pytest.mark.parametrize("vector", VECTORS["refused_binary"], ids=lambda v: v["name"])
async def test_each_implementation_refuses_the_tampered_binary_values(
    implementation: Implementation, vector: Vector
) -> None:
    value = bytes.fromhex(vector["hex"])
    with pytest.raises(DecryptionError) as caught:
        await ring(implementation).open_async(value, vector["place"])
    assert PROBLEMS[vector["problem"]] in caught.value.problem
    assert_names_no_key(caught.value)
    assert is_envelope(value) is (vector["problem"] in ("unknown_key", "not_authentic"))


@pytest.mark.parametrize("vector", VECTORS["refused"], ids=lambda v: v["name"])
def test_envelope_key_id_reads_the_structure_only(vector: Vector) -> None:
    structural = vector["problem"] in ("unknown_key", "not_authentic")
    assert is_envelope(vector["envelope"]) is structural
    key_id = envelope_key_id(vector["envelope"])
    assert (key_id is not None) is structural
    if structural:
        assert vector["envelope"].startswith(f"enc1{vector['envelope'][4]}.{key_id}.")


# --- the keyring ------------------------------------------------------------------------------------

BAD_KEYRINGS: list[tuple[str, Callable[[], Keyring], str]] = [
    ("empty ring", lambda: Keyring({}, primary="k1"), "at least one key"),
    ("not a mapping", lambda: Keyring([("k1", K1)], "k1"), "at least one key"),  # type: ignore[arg-type]
    ("16-byte key", lambda: Keyring({"k1": K1[:16]}, primary="k1"), "is 16 bytes"),
    ("31-byte key", lambda: Keyring({"k1": K1[:31]}, primary="k1"), "is 31 bytes"),
    ("33-byte key", lambda: Keyring({"k1": K1 + b"x"}, primary="k1"), "is 33 bytes"),
    ("a str key", lambda: Keyring({"k1": K1.hex()}, primary="k1"), "not str"),  # type: ignore[dict-item]
    ("unknown primary", lambda: Keyring({"k1": K1}, primary="k2"), "'k2' is not in the keyring"),
    ("primary not a str", lambda: Keyring({"k1": K1}, 1), "is not in the keyring"),  # type: ignore[arg-type]
    ("empty key id", lambda: Keyring({"": K1}, primary=""), "cannot be stored"),
    ("a dot in the key id", lambda: Keyring({"k.1": K1}, primary="k.1"), "cannot be stored"),
    ("a space in the key id", lambda: Keyring({"k 1": K1}, primary="k 1"), "cannot be stored"),
    ("non-ASCII key id", lambda: Keyring({"clé": K1}, primary="clé"), "cannot be stored"),
    ("65-character key id", lambda: Keyring({"k" * 65: K1}, primary="k" * 65), "cannot be stored"),
    ("int key id", lambda: Keyring({1: K1}, 1), "of type int cannot be"),  # type: ignore[dict-item, arg-type]
    ("one key, two ids", lambda: Keyring({"k1": K1, "k2": bytearray(K1)}, primary="k1"), "same key"),
    ("unknown implementation",
     lambda: Keyring({"k1": K1}, "k1", implementation="openssl"),  # type: ignore[arg-type]
     "implementation is one of"),
    ("nonce source not callable",
     lambda: Keyring({"k1": K1}, "k1", nonce_source=b"x" * 12),  # type: ignore[arg-type]
     "nonce_source"),
]


@pytest.mark.parametrize(("build", "message"), [(b, m) for _, b, m in BAD_KEYRINGS],
                         ids=[n for n, _, _ in BAD_KEYRINGS])
def test_a_bad_keyring_is_refused_at_construction(build: Callable[[], Keyring], message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        build()
    assert_names_no_key(caught.value)


def test_the_keyring_shows_its_ids_and_never_a_key() -> None:
    keyring = Keyring({"k2": K2, "k1": bytearray(K1)}, primary="k2")
    assert keyring.primary == "k2" and keyring.key_ids == ("k2", "k1")
    assert repr(keyring) == "Keyring(key_ids=('k2', 'k1'), primary='k2')"


def test_decryption_error_is_a_durable_agent_error_with_a_stable_code() -> None:
    assert durable_agent.DecryptionError is durable_agent.encryption.DecryptionError
    error = DecryptionError(PLACE, "it is not authentic")
    assert isinstance(error, durable_agent.DurableAgentError) and isinstance(error, ValueError)
    assert error.code == "decryption_failed" and error.place == PLACE
    assert str(error) == ("cannot decrypt the value stored at ('checkpoint-message', 'run-42', 3): "
                          "it is not authentic")


@pytest.mark.parametrize("plaintext", ["", "x", '{"role":"user","content":"hello"}', "日本語 🌍\u2028",
                                       b"", b"\x00\xff", bytes(range(256)) * 256, "é" * 40_000],
                         ids=["empty text", "one char", "codec text", "non-ASCII", "empty bytes", "two bytes",
                              "64 KiB bytes", "80 KB text"])
async def test_round_trip_gives_back_the_same_value_and_type(
    implementation: Implementation, plaintext: str | bytes
) -> None:
    keyring = ring(implementation)
    stored = await keyring.seal_async(plaintext, PLACE)
    assert envelope_key_id(stored) == "k2" and stored.isascii()
    opened = await keyring.open_async(stored, PLACE)
    assert opened == plaintext and type(opened) is type(plaintext)


async def test_the_binary_form_is_the_text_form_without_base64(implementation: Implementation) -> None:
    keyring = ring(implementation)
    stored = await keyring.seal_async("a tool result " * 100, PLACE, binary=True)
    assert isinstance(stored, bytes) and stored.startswith(b"enc1t.k2.")
    assert len(stored) == len("enc1t.k2.") + 12 + len("a tool result " * 100) + 16
    text_form = "enc1t.k2." + base64.b64encode(stored[len("enc1t.k2."):]).decode()
    assert await keyring.open_async(text_form, PLACE) == await keyring.open_async(stored, PLACE)


async def test_each_seal_draws_a_fresh_nonce(implementation: Implementation) -> None:
    keyring = ring(implementation)
    first, second = [await keyring.seal_async("same text", PLACE) for _ in range(2)]
    assert first != second
    assert [await keyring.open_async(v, PLACE) for v in (first, second)] == ["same text", "same text"]


@needs_sync_pair
async def test_the_sync_and_async_pairs_read_each_other() -> None:
    keyring = ring()
    assert await keyring.open_async(keyring.seal(bytearray(b"tool output"), PLACE), PLACE) == b"tool output"
    assert keyring.open(await keyring.seal_async("text", PLACE), PLACE) == "text"


@pytest.mark.parametrize("other", [("checkpoint-message", "run-43", 3), ("checkpoint-message", "run-42", 4),
                                   ("checkpoint-message", "run-42", "3"), ("stream-partial", "run-42", 3),
                                   ("checkpoint-message", "run-42"), ("checkpoint-message", "run-42", 3, 0)])
async def test_an_envelope_opens_only_at_its_place(
    implementation: Implementation, other: tuple[str | int, ...]
) -> None:
    keyring = ring(implementation)
    stored = await keyring.seal_async("secret text", PLACE)
    with pytest.raises(DecryptionError, match="not authentic") as caught:
        await keyring.open_async(stored, other)
    assert caught.value.place == other and "secret text" not in str(caught.value)


@pytest.mark.parametrize("place", [(), [], "checkpoint-message", b"ab", None, ("a", True), ("a", 1.5),
                                   ("a", None),
                                   ("a", b"b"), ("\ud800",), ("a", 10**5000)],
                         ids=["empty tuple", "empty list", "a str", "bytes", "None", "a bool", "a float",
                              "None part",
                              "a bytes part", "a lone surrogate", "a huge int"])
def test_a_place_that_cannot_be_encoded_is_a_configuration_error(place: Any) -> None:
    keyring = ring()
    with pytest.raises(ConfigurationError, match="place"):
        associated_data(place)
    with pytest.raises(ConfigurationError, match="place"):
        keyring.seal("x", place)
    with pytest.raises(ConfigurationError, match="place"):
        keyring.open("enc1t.k2." + "A" * 40, place)


@pytest.mark.parametrize("plaintext", [123, None, ["a"], "\ud800"],
                         ids=["int", "None", "list", "lone surrogate"])
def test_a_plaintext_that_is_not_text_or_bytes_is_a_codec_error(plaintext: Any) -> None:
    with pytest.raises(CodecError):
        ring().seal(plaintext, PLACE)


async def test_rotation_old_envelopes_open_new_ones_use_the_primary(implementation: Implementation) -> None:
    before = Keyring({"k1": K1}, primary="k1", implementation=implementation)
    old = await before.seal_async("written before the rotation", PLACE)
    rotated = ring(implementation)
    assert await rotated.open_async(old, PLACE) == "written before the rotation"
    new = await rotated.seal_async("written after", PLACE)
    assert envelope_key_id(old) == "k1" and envelope_key_id(new) == "k2"
    rekeyed = await rotated.seal_async(await rotated.open_async(old, PLACE), PLACE)  # what rekey will do
    retired = Keyring({"k2": K2}, primary="k2", implementation=implementation)
    opened = [await retired.open_async(v, PLACE) for v in (new, rekeyed)]
    assert opened == ["written after", "written before the rotation"]
    with pytest.raises(DecryptionError, match="key id 'k1', not in this keyring") as caught:
        await retired.open_async(old, PLACE)
    assert_names_no_key(caught.value)


def test_a_nonce_source_must_give_12_bytes() -> None:
    keyring = ring(nonce_source=lambda: b"\x00" * 11)
    with pytest.raises(ConfigurationError, match="12 bytes"):
        keyring.seal("x", PLACE)


def test_webcrypto_has_no_synchronous_pair() -> None:
    keyring = ring("webcrypto")
    with pytest.raises(FeatureUnavailableError, match="seal_async/open_async"):
        keyring.seal("x", PLACE)
    with pytest.raises(FeatureUnavailableError, match="seal_async/open_async"):
        keyring.open("enc1t.k2." + "A" * 40, PLACE)


@pytest.mark.skipif(ON_PYODIDE, reason="on CPython only: there is no crypto.subtle to reach")
async def test_webcrypto_outside_pyodide_is_a_feature_unavailable_error() -> None:
    with pytest.raises(FeatureUnavailableError, match="Pyodide"):
        await ring("webcrypto").seal_async("x", PLACE)


@needs_sync_pair
@settings(max_examples=60, deadline=None)
@given(plaintext=st.one_of(st.text(), st.binary()),
       place=st.lists(st.one_of(st.text(), st.integers()), min_size=1, max_size=4),
       data=st.data())
def test_any_value_round_trips_and_any_changed_character_is_refused(
    plaintext: str | bytes, place: list[str | int], data: st.DataObject
) -> None:
    keyring = ring()
    stored = keyring.seal(plaintext, place)
    assert keyring.open(stored, place) == plaintext
    at = data.draw(st.integers(0, len(stored) - 1))
    replacement = data.draw(st.sampled_from("A_-.9zé").filter(lambda c: c != stored[at]))
    with pytest.raises(DecryptionError):
        keyring.open(stored[:at] + replacement + stored[at + 1:], place)
    with pytest.raises(DecryptionError):
        keyring.open(stored[:at], place)


# --- Keyring.from_env -------------------------------------------------------------------------------

def b64(key: bytes) -> str:
    return base64.b64encode(key).decode()


def test_from_env_reads_ids_and_keys_and_the_first_is_primary() -> None:
    unpadded_url_safe = base64.urlsafe_b64encode(K1).decode().rstrip("=")
    keyring = Keyring.from_env({"DURABLE_AGENT_KEYS": f" k2:{b64(K2)} , k1:{unpadded_url_safe}"})
    assert keyring.key_ids == ("k2", "k1") and keyring.primary == "k2"
    explicit = Keyring.from_env({"DURABLE_AGENT_KEYS": f"k2:{b64(K2)},k1:{b64(K1)}",
                                 "DURABLE_AGENT_PRIMARY_KEY": "k1"})
    assert explicit.primary == "k1"


def test_from_env_reads_os_environ_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DURABLE_AGENT_KEYS", f"prod-2026:{b64(K2)}")
    monkeypatch.delenv("DURABLE_AGENT_PRIMARY_KEY", raising=False)
    assert Keyring.from_env().key_ids == ("prod-2026",)


@pytest.mark.parametrize(("environ", "message"), [
    ({}, "DURABLE_AGENT_KEYS is not set"),
    ({"DURABLE_AGENT_KEYS": "  "}, "DURABLE_AGENT_KEYS is not set"),
    ({"DURABLE_AGENT_KEYS": b64(K1)}, "entry 1 is not 'id:<base64 key>'"),
    ({"DURABLE_AGENT_KEYS": f"k2:{b64(K2)},k 1:{b64(K1)}"}, "entry 2 is not"),
    ({"DURABLE_AGENT_KEYS": f"k2:{b64(K2)},,k1:{b64(K1)}"}, "entry 2 is not"),
    ({"DURABLE_AGENT_KEYS": f"k1:{b64(K1)},k1:{b64(K2)}"}, "'k1' is listed twice"),
    ({"DURABLE_AGENT_KEYS": f"k1:{b64(K1)[:-2]}!!"}, "the key of 'k1' is not base64"),
    ({"DURABLE_AGENT_KEYS": f"k1:{b64(K1[:16])}"}, "key 'k1' is 16 bytes"),
    ({"DURABLE_AGENT_KEYS": f"k1:{b64(K1)}", "DURABLE_AGENT_PRIMARY_KEY": "k2"}, "'k2' is not in the"),
], ids=["unset", "blank", "no id", "bad id", "empty entry", "duplicate id", "not base64", "short key",
        "unknown primary"])
def test_from_env_errors_name_the_variable_and_entry_never_a_key(
    environ: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        Keyring.from_env(environ)
    assert_names_no_key(caught.value)
    assert b64(K1)[:12] not in str(caught.value) and b64(K1[:16])[:12] not in str(caught.value)


# --- what importing costs ---------------------------------------------------------------------------

@pytest.mark.host_only("runs a fresh interpreter in a subprocess")
def test_importing_and_building_a_keyring_imports_no_cryptography() -> None:
    probe = (
        "import sys\n"
        "from durable_agent.encryption import Keyring\n"
        "Keyring({'k1': bytes(32)}, primary='k1')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('cryptography', 'js', 'pyodide')))\n"
    )
    python_dir = Path(durable_agent.__file__).resolve().parent.parent
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(python_dir), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
