"""Native kernels of durable-agent (checked against the binary by mypy stubtest).

The same names, signatures and behaviour as ``durable_agent._pure``; use them through
``durable_agent._kernels``, which checks that ``__version__`` matches ``durable_agent``. One kernel is
native only: `envelopes_decode`, the fast path of ``durable_agent.encryption`` for loading many sealed rows.
"""

from typing import Any

__version__: str
__all__ = [
    "__version__",
    "_key_cache_stats",
    "b64url_decode",
    "b64url_encode",
    "decode",
    "encode",
    "envelopes_decode",
    "hmac_sha256",
    "token_open",
    "token_sign",
    "token_verify",
]

def encode(value: Any) -> str:
    """Encode JSON-compatible data (bytes allowed) to compact JSON text. Raises `CodecError`."""

def decode(text: str) -> Any:
    """Decode text produced by `encode` (or any JSON within the same limits). Raises `CodecError`."""

def _key_cache_stats(text: str) -> tuple[int, int, int]:
    """For tests: decode `text` and return what its key cache did: (lookups, slots probed, keys
    held at the end)."""

def b64url_encode(data: bytes) -> str:
    """Unpadded URL-safe base64 of `data`."""

def b64url_decode(text: object) -> bytes | None:
    """Decode canonical unpadded URL-safe base64; None for anything `b64url_encode` cannot produce."""

def hmac_sha256(key: bytes, message: bytes) -> bytes:
    """HMAC-SHA256 of `message` under `key` (32 bytes)."""

def token_open(token: object, key: bytes) -> Any:
    """`decode(token_verify(token, key))`: the payload of `token` as data if its MAC verifies
    under `key` and its payload text decodes, else None (None too for a payload of ``null``).
    Never raises on `token`."""

def token_sign(key: bytes, payload: str) -> str:
    """The `v1` token carrying `payload` (a text, normally codec JSON), MACed with `key`."""

def token_verify(token: object, key: bytes) -> str | None:
    """The payload text of `token` if its MAC verifies under `key`, else None. Never raises on `token`."""

def envelopes_decode(
    keys: dict[str, bytes], values: object, place_head: bytes, first: int
) -> tuple[list[Any], list[int]]:
    """`decode` of the texts that `values` (envelopes of text, stored as str or as bytes) seal, value ``i`` bound to the place
    whose associated data is ``place_head + str(first + i) + "]"``, under the keys of `keys` (key id to 32-byte
    key): ``(decoded, misses)``, `misses` the indexes of the values that did not open or decode (None in
    `decoded`), for the reference implementation to say why."""
