"""Signed approvals: `ApprovalSigner` mints and checks HMAC tokens for client-mode approvals.

A verdict that comes back from a browser is untrusted input. The server signs each pending
`ToolApprovalRequest` before showing it; the client echoes the token with its verdict; the
server honours an approval only if the token verifies and pins the very call being approved.
The format is written down byte for byte in ``docs/tokens.md``; what this does and does not
protect against is in ``docs/trust-boundary.md``.

This module is the *policy*: payload fields, expiry, run binding, key rotation, size caps.
The byte-level work (base64url, HMAC, constant-time comparison) is done by the kernels
(``_token_pure`` or the native extension), and the payload JSON by the checkpoint codec.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeGuard

from ._checkpoint import ToolApprovalRequest
from ._errors import ApprovalSigningError, CodecError, ConfigurationError
from ._kernels import kernels
from ._token_pure import b64url_encode
from ._util import wall_clock_ms

__all__ = [
    "APPROVAL_TOKEN_DENIED_REASON",
    "ApprovalSigner",
    "key_id_for",
    "payload_matches_call",
    "validate_max_age_ms",
    "wall_clock_ms",
]

APPROVAL_TOKEN_DENIED_REASON = "Approval token missing, invalid, expired, or bound to another run."
MIN_SECRET_BYTES = 32
DEFAULT_MAX_TOKEN_LENGTH = 64 * 1024
DEFAULT_MAX_CLOCK_SKEW_MS = 60_000
KEY_ID_DOMAIN = b"durable-agent kid\x00"
KEY_ID_LENGTH = 8

Clock = Callable[[], int]
Secret = str | bytes | bytearray

_REQUEST_FIELDS = frozenset({"approval_id", "tool_call_id", "tool_name", "input", "agent_path", "token"})
_PAYLOAD_REQUIRED = frozenset({"approval_id", "tool_call_id", "tool_name", "input", "issued_at", "kid"})


def _secret_bytes(secret: object, what: str) -> bytes:
    if isinstance(secret, str):
        try:
            raw = secret.encode("utf-8")
        except UnicodeEncodeError:
            raise ConfigurationError(f"{what} is not valid Unicode (it holds a lone surrogate)") from None
    elif isinstance(secret, (bytes, bytearray)):
        raw = bytes(secret)
    else:
        raise ConfigurationError(f"{what} must be str or bytes, not {type(secret).__name__}")
    if len(raw) < MIN_SECRET_BYTES:
        raise ConfigurationError(
            f"{what} is {len(raw)} bytes; an approval secret needs at least {MIN_SECRET_BYTES} "
            "(generate one with: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return raw


def key_id_for(secret: Secret) -> str:
    """The key id of `secret`: 8 base64url characters of SHA-256(b"durable-agent kid\\0" + secret).

    Derived, not configured, so a key keeps its id when it moves from current to previous,
    and two servers holding the same secret agree on it. The id reveals nothing usable about
    the secret (any token already is an HMAC of it); it is not secret itself.
    """
    raw = _secret_bytes(secret, "secret")
    return b64url_encode(hashlib.sha256(KEY_ID_DOMAIN + raw).digest())[:KEY_ID_LENGTH]


def validate_max_age_ms(max_age_ms: object) -> int | None:
    """Check a `max_age_ms` option: None (no expiry) or a non-negative int of milliseconds."""
    if max_age_ms is None:
        return None
    if type(max_age_ms) is not int or max_age_ms < 0:
        raise ConfigurationError(f"max_age_ms must be None or a non-negative int (ms), not {max_age_ms!r}")
    return max_age_ms


def _non_negative_int(value: object, name: str) -> int:
    if type(value) is not int or value < 0:
        raise ConfigurationError(f"{name} must be a non-negative int, not {value!r}")
    return value


def _request_fields(request: ToolApprovalRequest | Mapping[str, Any]) -> dict[str, Any]:
    """The request as its stored dict minus `token`, after checking every field."""
    if isinstance(request, ToolApprovalRequest):
        path = request.agent_path
        if path is not None and not (
            isinstance(path, (tuple, list)) and all(isinstance(p, str) for p in path)
        ):
            # checked here: to_dict() would quietly turn a str path into a list of its characters
            raise ApprovalSigningError("cannot sign approval request: agent_path must be a tuple of str")
        data = request.to_dict()
    elif isinstance(request, Mapping):
        data = dict(request)
        unknown = set(data) - _REQUEST_FIELDS
        if unknown:
            raise ApprovalSigningError(f"cannot sign approval request: unknown fields {sorted(unknown)}")
        if "input" not in data:
            raise ApprovalSigningError("cannot sign approval request: field 'input' is missing")
    else:
        raise TypeError(f"request must be a ToolApprovalRequest or a mapping, not {type(request).__name__}")
    try:
        fields = ToolApprovalRequest.from_dict(data).to_dict()
    except ValueError as exc:
        raise ApprovalSigningError(f"cannot sign approval request: {exc}") from None
    fields.pop("token", None)
    return fields


def _well_formed(payload: object, kid: str) -> TypeGuard[dict[str, Any]]:
    """True when a MAC-verified payload has exactly the fields and types `sign` writes.

    Written out test by test (no generators, no set built per call): it runs on every verify,
    whose budget is a small multiple of one HMAC."""
    if type(payload) is not dict:
        return False
    try:
        if not (
            payload["kid"] == kid
            and type(payload["issued_at"]) is int
            and type(payload["approval_id"]) is str
            and type(payload["tool_call_id"]) is str
            and type(payload["tool_name"]) is str
            and "input" in payload
        ):
            return False
    except KeyError:  # a required field is missing
        return False
    if len(payload) == len(_PAYLOAD_REQUIRED):  # the required fields and nothing else
        return True
    optional = 0
    if "run_id" in payload:
        if type(payload["run_id"]) is not str:
            return False
        optional = 1
    if "agent_path" in payload:
        path = payload["agent_path"]
        if type(path) is not list or not all(type(p) is str for p in path):
            return False
        optional += 1
    # Every required field is here: any field beyond them and the optional ones is unknown.
    return len(payload) == len(_PAYLOAD_REQUIRED) + optional


def _sorted_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _sorted_keys(value[key]) for key in sorted(value)}
    if isinstance(value, (list, tuple)):
        return [_sorted_keys(item) for item in value]
    return value


def _canonical(value: Any) -> str | None:
    """Codec JSON of `value` with object keys sorted, or None when it is not encodable data.

    Equal texts mean equal inputs to a tool: the codec is lossless and typed (``1``, ``1.0``
    and ``true`` differ; bytes differ from str), and only object key order is normalized.
    """
    try:
        return kernels.encode(_sorted_keys(value))
    except (CodecError, TypeError, RecursionError):  # TypeError: keys that cannot be ordered
        return None


class ApprovalSigner:
    """Signs pending approval requests and verifies the tokens that come back with verdicts.

    `secret` signs; every secret in `previous_secrets` is also accepted by `verify` but never
    signs (see the rotation procedure in ``docs/tokens.md``). Each secret is str (UTF-8) or
    bytes of at least 32 bytes. `clock` returns epoch milliseconds (default: the wall clock).
    Tokens longer than `max_token_length` characters are neither produced nor accepted. When
    `verify` is given a `max_age_ms`, a token issued more than `max_clock_skew_ms` in the
    future (a signer whose clock runs ahead) is refused as well.

    Stateless after construction and safe to share between tasks and threads.
    """

    __slots__ = ("_clock", "_keys", "_max_clock_skew_ms", "_max_token_length")

    def __init__(
        self,
        secret: Secret,
        *,
        previous_secrets: Iterable[Secret] = (),
        clock: Clock | None = None,
        max_token_length: int = DEFAULT_MAX_TOKEN_LENGTH,
        max_clock_skew_ms: int = DEFAULT_MAX_CLOCK_SKEW_MS,
    ) -> None:
        if isinstance(previous_secrets, (str, bytes, bytearray)):
            raise ConfigurationError("previous_secrets must be a list of secrets, not a single secret")
        raws = [_secret_bytes(secret, "secret")]
        raws += [_secret_bytes(s, f"previous_secrets[{i}]") for i, s in enumerate(previous_secrets)]
        keys: list[tuple[str, bytes]] = []
        for raw in raws:
            kid = key_id_for(raw)
            if any(kid == known for known, _ in keys):
                raise ConfigurationError(f"the same secret (key id {kid}) is listed twice")
            keys.append((kid, raw))
        if clock is not None and not callable(clock):
            raise ConfigurationError(f"clock must be a callable returning epoch ms, not {clock!r}")
        self._keys: tuple[tuple[str, bytes], ...] = tuple(keys)
        self._clock: Clock = clock if clock is not None else wall_clock_ms
        self._max_token_length = _non_negative_int(max_token_length, "max_token_length")
        self._max_clock_skew_ms = _non_negative_int(max_clock_skew_ms, "max_clock_skew_ms")

    def with_clock(self, clock: Clock) -> ApprovalSigner:
        """The same keys and limits on another clock (a replay-mode runtime passes its journaled one,
        so a replay signs the same tokens and judges their age as the first attempt did)."""
        if not callable(clock):
            raise ConfigurationError(f"clock must be a callable returning epoch ms, not {clock!r}")
        twin = object.__new__(ApprovalSigner)
        twin._keys, twin._clock = self._keys, clock
        twin._max_token_length, twin._max_clock_skew_ms = self._max_token_length, self._max_clock_skew_ms
        return twin

    @property
    def key_id(self) -> str:
        """The id of the current (signing) key."""
        return self._keys[0][0]

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of every key `verify` accepts, the current one first."""
        return tuple(kid for kid, _ in self._keys)

    def __repr__(self) -> str:
        return f"ApprovalSigner(key_id={self.key_id!r}, previous_key_ids={list(self.key_ids[1:])!r})"

    def _now(self) -> int:
        now = self._clock()
        if type(now) is not int:
            raise ConfigurationError(f"the signer's clock must return int epoch ms, it returned {now!r}")
        return now

    def sign(self, request: ToolApprovalRequest | Mapping[str, Any], *, run_id: str | None = None) -> str:
        """A token pinning `request` (its `token` field ignored), bound to `run_id` when given.

        Raises `TypeError` for a request or run id of the wrong type, `ApprovalSigningError`
        for a malformed request or a token over the length cap, `CodecError` for an input
        that is not JSON-compatible data.
        """
        payload = _request_fields(request)
        if run_id is not None:
            if not isinstance(run_id, str):
                raise TypeError(f"run_id must be str or None, not {type(run_id).__name__}")
            payload["run_id"] = run_id
        kid, key = self._keys[0]
        payload["issued_at"] = self._now()
        payload["kid"] = kid
        token: str = kernels.token_sign(key, kernels.encode(payload))
        if len(token) > self._max_token_length:
            raise ApprovalSigningError(
                f"the approval token would be {len(token)} characters, over the signer's "
                f"max_token_length of {self._max_token_length}; the tool input is too large to sign"
            )
        return token

    def verify(self, token: object, *, max_age_ms: int | None = None) -> dict[str, Any] | None:
        """The signed payload if `token` is genuine and fresh, else None. Never raises on `token`.

        The payload holds the request fields (`approval_id`, `tool_call_id`, `tool_name`,
        `input`, and `agent_path` when set), `run_id` when bound, `issued_at` (epoch ms) and
        `kid`. With `max_age_ms`, a token whose age is >= max_age_ms is expired. A bad
        `max_age_ms` or a clock returning a non-int raises `ConfigurationError`.
        """
        max_age = validate_max_age_ms(max_age_ms)
        if type(token) is not str or len(token) > self._max_token_length:
            return None
        for kid, key in self._keys:  # noqa: B007 - `kid` of the key that verified is read below the loop
            payload = kernels.token_open(token, key)  # None: a bad MAC, or a payload that is not JSON
            if payload is not None:
                break
        else:
            return None
        if not _well_formed(payload, kid):
            return None
        if max_age is not None:
            age = self._now() - payload["issued_at"]
            if age >= max_age or -age > self._max_clock_skew_ms:
                return None
        return payload

    def check_approval(
        self,
        token: object,
        *,
        approval_id: str,
        tool_call_id: str,
        tool_name: str,
        input: Any,
        run_id: str | None = None,
        max_age_ms: int | None = None,
    ) -> bool:
        """Whether `token` authorizes approving exactly this call. Never raises on `token`.

        True only when the token verifies (genuine MAC, from a listed key, younger than
        `max_age_ms` when set), names this `approval_id`, `tool_call_id` and `tool_name`,
        carries an input equal to `input` as canonical codec JSON (typed, object key order
        ignored; see `_canonical`), and, when both the call and the token have a run id, was
        bound to this run.
        """
        payload = self.verify(token, max_age_ms=max_age_ms)
        return payload is not None and payload_matches_call(
            payload,
            approval_id=approval_id,
            tool_call_id=tool_call_id,
            tool_name=tool_name,
            input=input,
            run_id=run_id,
        )


def payload_matches_call(
    payload: object,
    *,
    approval_id: str,
    tool_call_id: str,
    tool_name: str,
    input: Any,
    run_id: str | None = None,
) -> bool:
    """Whether a verified token payload pins exactly this call (the comparisons of `check_approval`).

    For a loop holding any signer with the `sign`/`verify` shape: verify the token, then ask
    this. Anything that is not a payload as `verify` returns it (not a dict, fields missing
    or of the wrong type) does not match.
    """
    if type(payload) is not dict:
        return False
    ids = (payload.get("approval_id"), payload.get("tool_call_id"), payload.get("tool_name"))
    if not all(type(value) is str for value in ids) or ids != (approval_id, tool_call_id, tool_name):
        return False
    bound = payload.get("run_id")
    if run_id is not None and bound is not None and bound != run_id:
        return False
    if "input" not in payload:
        return False
    signed_input = _canonical(payload["input"])
    return signed_input is not None and signed_input == _canonical(input)
