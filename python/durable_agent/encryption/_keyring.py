"""`Keyring`: AES-256-GCM keys by id, one primary; seals and opens envelopes (docs/encryption.md)."""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, overload

from .._errors import ConfigurationError, DecryptionError, FeatureUnavailableError
from . import _envelope
from ._engines import (
    AuthenticationFailed,
    CryptographyEngine,
    WebCryptoEngine,
    cryptography_available,
    native_envelopes_decode,
    webcrypto_available,
)
from ._envelope import NONCE_BYTES, Envelope, Place, Plaintext, associated_data

KEY_BYTES = 32
ENV_KEYS = "DURABLE_AGENT_KEYS"
ENV_PRIMARY = "DURABLE_AGENT_PRIMARY_KEY"
IMPLEMENTATIONS = ("auto", "cryptography", "webcrypto")
AUTHENTICATION_FAILED = "it is not authentic: sealed with another key, bound to another place, or altered"

Implementation = Literal["auto", "cryptography", "webcrypto"]
NonceSource = Callable[[], bytes]


def _random_nonce() -> bytes:
    return os.urandom(NONCE_BYTES)


class Keyring:
    """AES-256-GCM keys by id, one of them primary: new envelopes are sealed with the primary key, and an
    envelope sealed with any key of the ring opens.

    ``Keyring({"k2": key2, "k1": key1}, primary="k2")``: each key is 32 bytes; a key id is 1 to 64 of
    ``A-Z a-z 0-9 - _`` (it is stored in every envelope). Another key size, an empty ring, an id that cannot
    be stored, one key under two ids or a primary the ring does not hold is a `ConfigurationError`.

    `seal`/`open` are synchronous and use `cryptography` (``pip install 'durable-agent[crypto]'``; imported
    when a key is first used). `seal_async`/`open_async` are the same for code that runs on an event loop;
    `implementation` picks what they use:

    * ``"auto"`` (default): `cryptography` when it is importable, else WebCrypto (``crypto.subtle``) under
      Pyodide (a Cloudflare Worker, a browser);
    * ``"cryptography"``: always `cryptography`;
    * ``"webcrypto"``: always WebCrypto; `seal`/`open` then raise `FeatureUnavailableError` (WebCrypto has
      no synchronous call).

    `strict`: whether a store opened with this keyring refuses a stored value that is not an envelope
    (`DecryptionError`, "it is not an envelope") instead of reading it as plaintext written before encryption
    was turned on. The default, lenient, lets a keyring be turned on over an existing database; once
    `durable_agent.encryption.rekey` has sealed every row, ``strict=True`` makes a plaintext row planted
    by whoever can write the database fail to load rather than load silently.

    Every implementation writes and reads the same envelopes. `nonce_source` exists for test vectors only:
    AES-GCM is broken when two values are sealed under one key with one nonce, so production code leaves
    it to the default, 12 fresh bytes of ``os.urandom`` per seal.
    """

    def __init__(
        self,
        keys: Mapping[str, bytes | bytearray],
        primary: str,
        *,
        implementation: Implementation = "auto",
        nonce_source: NonceSource | None = None,
        strict: bool = False,
    ) -> None:
        if not isinstance(keys, Mapping) or not keys:
            raise ConfigurationError("a keyring needs at least one key: a mapping of key id to 32-byte key")
        held: dict[str, bytes] = {}
        ids_by_key: dict[bytes, str] = {}
        for key_id, key in keys.items():
            if not _envelope.valid_key_id(key_id):
                shown = repr(key_id) if isinstance(key_id, str) else f"of type {type(key_id).__name__}"
                raise ConfigurationError(f"key id {shown} cannot be stored: use 1 to 64 of A-Z a-z 0-9 - _")
            if not isinstance(key, (bytes, bytearray)):
                raise ConfigurationError(
                    f"key {key_id!r} must be 32 bytes, not {type(key).__name__} (decode a base64 key first, "
                    "or use Keyring.from_env)"
                )
            if len(key) != KEY_BYTES:
                raise ConfigurationError(f"key {key_id!r} is {len(key)} bytes; AES-256 keys are {KEY_BYTES}")
            if bytes(key) in ids_by_key:
                raise ConfigurationError(
                    f"keys {ids_by_key[bytes(key)]!r} and {key_id!r} are the same key: give a key one id"
                )
            held[key_id] = bytes(key)
            ids_by_key[held[key_id]] = key_id
        if not isinstance(primary, str) or primary not in held:
            raise ConfigurationError(f"the primary key id {primary!r} is not in the keyring ({_ids(held)})")
        if implementation not in IMPLEMENTATIONS:
            raise ConfigurationError(f"implementation is one of {IMPLEMENTATIONS}, not {implementation!r}")
        if nonce_source is not None and not callable(nonce_source):
            raise ConfigurationError("nonce_source must be a callable returning 12 bytes")
        if type(strict) is not bool:
            raise ConfigurationError(f"strict must be a bool, got {strict!r}")
        self._strict = strict
        self._keys = held
        self._primary = primary
        self._implementation: Implementation = implementation
        self._nonce_source = nonce_source or _random_nonce
        self._sync_engine: CryptographyEngine | None = None
        self._async_engine: CryptographyEngine | WebCryptoEngine | None = None
        self._native_decode = native_envelopes_decode() if implementation == "auto" else None

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, *, implementation: Implementation = "auto", strict: bool = False
    ) -> Keyring:
        """The keyring described by ``DURABLE_AGENT_KEYS`` and ``DURABLE_AGENT_PRIMARY_KEY`` (`environ`:
        ``os.environ`` by default).

        ``DURABLE_AGENT_KEYS="k2:<base64 key>,k1:<base64 key>"``: comma-separated ``id:key`` entries, each
        key 32 bytes in base64 (standard or URL-safe alphabet, padding optional). The primary is
        ``DURABLE_AGENT_PRIMARY_KEY`` when set, else the first entry. Errors name the variable, the entry
        and the id, never a key.
        """
        env = os.environ if environ is None else environ
        listing = env.get(ENV_KEYS, "").strip()
        if not listing:
            raise ConfigurationError(f"{ENV_KEYS} is not set: it lists the keys as 'id:<base64 key>,...'")
        keys: dict[str, bytes] = {}
        for number, entry in enumerate(listing.split(","), 1):
            key_id, colon, encoded = entry.strip().partition(":")
            if not colon or not _envelope.valid_key_id(key_id):
                raise ConfigurationError(
                    f"{ENV_KEYS}: entry {number} is not 'id:<base64 key>' "
                    "with an id of 1 to 64 of A-Z a-z 0-9 - _"
                )
            if key_id in keys:
                raise ConfigurationError(f"{ENV_KEYS}: key id {key_id!r} is listed twice")
            keys[key_id] = _decode_base64_key(encoded.strip(), key_id)
        primary = env.get(ENV_PRIMARY, "").strip() or next(iter(keys))
        return cls(keys, primary, implementation=implementation, strict=strict)

    @property
    def primary(self) -> str:
        """The id of the key new envelopes are sealed with."""
        return self._primary

    @property
    def strict(self) -> bool:
        """Whether stores refuse stored values that are not envelopes (see the class docs)."""
        return self._strict

    @property
    def key_ids(self) -> tuple[str, ...]:
        """The ids of every key held, in the order given."""
        return tuple(self._keys)

    def __repr__(self) -> str:
        strict = ", strict=True" if self._strict else ""
        return f"Keyring(key_ids={self.key_ids!r}, primary={self._primary!r}{strict})"

    # --- sealing and opening ---------------------------------------------------------------------------

    @overload
    def seal(self, plaintext: Plaintext, place: Place, *, binary: Literal[False] = False) -> str: ...
    @overload
    def seal(self, plaintext: Plaintext, place: Place, *, binary: Literal[True]) -> bytes: ...
    @overload
    def seal(self, plaintext: Plaintext, place: Place, *, binary: bool) -> str | bytes: ...

    def seal(self, plaintext: Plaintext, place: Place, *, binary: bool = False) -> str | bytes:
        """The envelope of `plaintext` (text or bytes) under the primary key, bound to `place`: a str, or with
        ``binary=True`` the same envelope as bytes without the base64, for stores that hold bytes."""
        form, data, nonce, aad = self._begin_seal(plaintext, place)
        sealed = self._sync().encrypt(self._primary, nonce, data, aad)
        return (_envelope.build_binary if binary else _envelope.build)(form, self._primary, nonce, sealed)

    def open(self, value: object, place: Place) -> str | bytes:
        """The plaintext `value` seals (a str or bytes, as it was sealed), when it was sealed for `place`.
        `value` is an envelope in either form: a str, or bytes (``seal(..., binary=True)``).

        Raises `DecryptionError` when `value` is not an envelope, its key id is not in the ring, or it is not
        authentic (another key, another place, a flipped or missing byte).
        """
        envelope, aad = self._begin_open(value, place)
        try:
            data = self._sync().decrypt(envelope.key_id, envelope.nonce, envelope.sealed, aad)
        except AuthenticationFailed:
            raise DecryptionError(tuple(place), AUTHENTICATION_FAILED) from None
        return _plaintext(envelope, data, place)

    def _decode_fast(self, values: Sequence[object], place: Place, first: int) -> tuple[list[Any], list[int]] | None:
        """The codec values of the texts `values` seal, value ``i`` at ``(*place, first + i)``, opened and decoded
        in one call of the native kernels: ``(decoded, misses)``, `misses` the indexes of the values that call
        did not open or decode (None in `decoded`); `open` then says why (it raises, or the caller reads a
        plaintext row). None, not a pair, when there are no native kernels or `implementation` is not
        ``"auto"``: the caller opens and decodes each value itself.

        What a store calls for the many rows of one checkpoint: one native call costs a small part of a call
        of `open` per row (benches/bench_encryption_stores.py).
        """
        if self._native_decode is None:
            return None
        head = associated_data((*place, 0))[:-2]  # the place's associated data without its last part, "0]"
        return self._native_decode(self._keys, values, head, first)

    @overload
    async def seal_async(
        self, plaintext: Plaintext, place: Place, *, binary: Literal[False] = False
    ) -> str: ...
    @overload
    async def seal_async(self, plaintext: Plaintext, place: Place, *, binary: Literal[True]) -> bytes: ...
    @overload
    async def seal_async(self, plaintext: Plaintext, place: Place, *, binary: bool) -> str | bytes: ...

    async def seal_async(self, plaintext: Plaintext, place: Place, *, binary: bool = False) -> str | bytes:
        """`seal`, through the implementation the keyring's `implementation` picks for async code."""
        form, data, nonce, aad = self._begin_seal(plaintext, place)
        engine = self._async()
        if isinstance(engine, WebCryptoEngine):
            sealed = await engine.encrypt(self._primary, nonce, data, aad)
        else:
            sealed = engine.encrypt(self._primary, nonce, data, aad)
        return (_envelope.build_binary if binary else _envelope.build)(form, self._primary, nonce, sealed)

    async def open_async(self, value: object, place: Place) -> str | bytes:
        """`open`, through the implementation the keyring's `implementation` picks for async code."""
        envelope, aad = self._begin_open(value, place)
        engine = self._async()
        try:
            if isinstance(engine, WebCryptoEngine):
                data = await engine.decrypt(envelope.key_id, envelope.nonce, envelope.sealed, aad)
            else:
                data = engine.decrypt(envelope.key_id, envelope.nonce, envelope.sealed, aad)
        except AuthenticationFailed:
            raise DecryptionError(tuple(place), AUTHENTICATION_FAILED) from None
        return _plaintext(envelope, data, place)

    # --- the shared halves -----------------------------------------------------------------------------

    def _begin_seal(self, plaintext: Plaintext, place: Place) -> tuple[str, bytes, bytes, bytes]:
        """(form, plaintext bytes, nonce, GCM associated data) of a seal under the primary key."""
        form, data = _envelope.plaintext_bytes(plaintext)
        aad = _envelope.header(form, self._primary).encode("ascii") + associated_data(place)
        nonce = self._nonce_source()
        if not isinstance(nonce, bytes) or len(nonce) != NONCE_BYTES:
            raise ConfigurationError(f"the nonce source must return {NONCE_BYTES} bytes")
        return form, data, nonce, aad

    def _begin_open(self, value: object, place: Place) -> tuple[Envelope, bytes]:
        aad_of_place = associated_data(place)
        envelope = _envelope.parse_or_raise(value, place)
        if envelope.key_id not in self._keys:
            problem = f"it was sealed with key id {envelope.key_id!r}, not in this keyring"
            raise DecryptionError(tuple(place), f"{problem} ({_ids(self._keys)})")
        return envelope, envelope.header.encode("ascii") + aad_of_place

    def _sync(self) -> CryptographyEngine:
        if self._implementation == "webcrypto":
            raise FeatureUnavailableError(
                "this keyring uses WebCrypto, which has no synchronous call: use seal_async/open_async"
            )
        if self._sync_engine is None:
            self._sync_engine = CryptographyEngine(self._keys)
        return self._sync_engine

    def _async(self) -> CryptographyEngine | WebCryptoEngine:
        if self._async_engine is None:
            use_webcrypto = self._implementation == "webcrypto" or (
                self._implementation == "auto" and not cryptography_available() and webcrypto_available()
            )
            self._async_engine = WebCryptoEngine(self._keys) if use_webcrypto else self._sync()
        return self._async_engine


def _plaintext(envelope: Envelope, data: bytes, place: Place) -> str | bytes:
    if envelope.form == "b":
        return data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:  # only a sealer that broke the format writes this
        raise DecryptionError(tuple(place), "its text is not valid UTF-8") from None


def _decode_base64_key(encoded: str, key_id: str) -> bytes:
    standard = encoded.replace("-", "+").replace("_", "/").rstrip("=")
    try:
        return base64.b64decode(standard + "=" * (-len(standard) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ConfigurationError(f"{ENV_KEYS}: the key of {key_id!r} is not base64") from None


def _ids(keys: Mapping[str, bytes]) -> str:
    return "it holds " + ", ".join(repr(key_id) for key_id in keys)
