"""The pure-Python kernels: the reference implementation the native extension mirrors name for name."""

from __future__ import annotations

from typing import Any

from ._codec_pure import decode, encode
from ._errors import CodecError
from ._token_pure import b64url_decode, b64url_encode, hmac_sha256, token_sign, token_verify

__all__ = [
    "b64url_decode",
    "b64url_encode",
    "decode",
    "encode",
    "hmac_sha256",
    "token_open",
    "token_sign",
    "token_verify",
]


def token_open(token: object, key: bytes) -> Any:
    """`decode(token_verify(token, key))`: the payload of `token` as data if its MAC verifies
    under `key` and its payload text decodes, else None (None too for a payload of ``null``).
    Never raises on `token`.

    One kernel call for `ApprovalSigner.verify`, so the native path makes no payload str and
    crosses into Python once.
    """
    text = token_verify(token, key)
    if text is None:
        return None
    try:
        return decode(text)
    except CodecError:
        return None
