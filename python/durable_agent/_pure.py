"""The pure-Python kernels: the reference implementation the native extension mirrors name for name."""

from __future__ import annotations

from ._codec_pure import decode, encode
from ._token_pure import b64url_decode, b64url_encode, hmac_sha256, token_sign, token_verify

__all__ = ["b64url_decode", "b64url_encode", "decode", "encode", "hmac_sha256", "token_sign", "token_verify"]
