"""The approval-token kernels: canonical base64url, HMAC-SHA256, and the `v1` token MAC.

These are the reference implementations the native extension mirrors name for name and
behaviour for behaviour (same results, same rejections, same exception types); the
golden vectors in ``tests/vectors/tokens.json`` pin them. The seam is deliberately narrow:
bytes and str in, bytes/str/None out. Everything that is *policy* (payload fields, expiry,
run binding, key rotation, length caps) lives in ``signing.py``, once.

Contract, shared by both implementations:

* ``b64url_encode(data: bytes) -> str``: RFC 4648 section 5 alphabet, no padding.
* ``b64url_decode(text) -> bytes | None``: the inverse, accepting only the canonical form
  (what ``b64url_encode`` produces): no padding, no other characters, no length of the
  form ``4k+1``, unused trailing bits zero. Anything else, including a non-str, is None.
* ``hmac_sha256(key: bytes, message: bytes) -> bytes``: the 32-byte MAC (RFC 2104/4231).
* ``token_sign(key: bytes, payload: str) -> str``: ``v1.<b64url(utf8(payload))>.<mac>``
  where mac is ``b64url(hmac_sha256(key, ascii("v1.<payload segment>")))``.
* ``token_verify(token, key: bytes) -> str | None``: the payload text of a token whose MAC
  verifies under `key` (constant-time comparison), else None, for any input whatsoever.

Argument type errors that are programming mistakes (a key that is not bytes, a payload that
is not str) raise `TypeError`; a payload with a lone surrogate raises `UnicodeEncodeError`.
Untrusted input (the text to decode, the token) never raises.
"""

from __future__ import annotations

import base64
import binascii
import hmac

__all__ = ["b64url_decode", "b64url_encode", "hmac_sha256", "token_sign", "token_verify"]

TOKEN_PREFIX = "v1."
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
_INDEX = {char: i for i, char in enumerate(_ALPHABET)}
# URL-safe to standard alphabet; '+', '/' and '=' become '!' so strict decoding refuses them.
_TO_STANDARD = bytes.maketrans(b"-_+/=", b"+/!!!")
_PADDING = {0: b"", 2: b"==", 3: b"="}
# For a text of length 4k+2 the last character carries 4 unused bits; for 4k+3, 2 bits.
_UNUSED_BITS = {2: 0b1111, 3: 0b0011}


def _need_bytes(value: object, name: str) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, not {type(value).__name__}")
    return value


def b64url_encode(data: bytes) -> str:
    """Unpadded URL-safe base64 of `data`."""
    return base64.urlsafe_b64encode(_need_bytes(data, "data")).rstrip(b"=").decode("ascii")


def b64url_decode(text: object) -> bytes | None:
    """Decode canonical unpadded URL-safe base64; None for anything `b64url_encode` cannot produce."""
    if not isinstance(text, str) or not text.isascii():
        return None
    tail = len(text) % 4
    if tail == 1 or (tail and _INDEX.get(text[-1], 0) & _UNUSED_BITS[tail]):
        return None
    try:  # strict mode refuses every character outside the (translated) alphabet
        return binascii.a2b_base64(
            text.encode("ascii").translate(_TO_STANDARD) + _PADDING[tail], strict_mode=True
        )
    except binascii.Error:
        return None


def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of `message` under `key` (32 bytes)."""
    return hmac.digest(_need_bytes(key, "key"), _need_bytes(message, "message"), "sha256")


def token_sign(key: bytes, payload: str) -> str:
    """The `v1` token carrying `payload` (a text, normally codec JSON), MACed with `key`."""
    _need_bytes(key, "key")
    if not isinstance(payload, str):
        raise TypeError(f"payload must be str, not {type(payload).__name__}")
    body = TOKEN_PREFIX + b64url_encode(payload.encode("utf-8"))
    return body + "." + b64url_encode(hmac.digest(key, body.encode("ascii"), "sha256"))


def token_verify(token: object, key: bytes) -> str | None:
    """The payload text of `token` if its MAC verifies under `key`, else None. Never raises on `token`.

    The MAC is checked before the payload is decoded, so nothing of an unauthenticated
    payload is ever parsed.
    """
    _need_bytes(key, "key")
    if not isinstance(token, str) or not token.startswith(TOKEN_PREFIX) or not token.isascii():
        return None
    dot = token.rfind(".")
    if dot < len(TOKEN_PREFIX):  # no separator after the prefix: no MAC segment
        return None
    body = token[:dot]
    expected = b64url_encode(hmac.digest(key, body.encode("ascii"), "sha256"))
    if not hmac.compare_digest(expected, token[dot + 1 :]):
        return None
    raw = b64url_decode(body[len(TOKEN_PREFIX) :])
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None
