"""The AES-256-GCM engines: `cryptography` (synchronous: CPython, Pyodide) and WebCrypto (asynchronous:
``crypto.subtle`` through Pyodide's JS bridge, as in Cloudflare Workers).

Both take the same inputs and give the same bytes: ``ciphertext || tag`` (16-byte tag), the layout of
``AESGCM.encrypt`` and of ``crypto.subtle.encrypt``. A tag that does not verify is `AuthenticationFailed`,
whatever the engine raised. Each engine prepares a key once per key id (an ``AESGCM`` object, an imported
``CryptoKey``) and keeps it. Nothing here is imported before a key is used.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from .._errors import FeatureUnavailableError

INSTALL_HINT = "pip install 'durable-agent[crypto]'"


class AuthenticationFailed(Exception):
    """The tag did not verify: another key, another associated data, or altered bytes (internal)."""


def cryptography_available() -> bool:
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM  # noqa: F401
    except ImportError:
        return False
    return True


def webcrypto_available() -> bool:
    """True under Pyodide (a browser, Node, a Cloudflare Worker) when the JS ``crypto.subtle`` exists."""
    if sys.platform != "emscripten":
        return False
    import js

    return getattr(getattr(js, "crypto", None), "subtle", None) is not None


def native_envelopes_decode() -> Callable[..., tuple[list[Any], list[int]]] | None:
    """The native kernels' `envelopes_decode` (many sealed rows opened and decoded in one call) when the native
    kernels are active, else None."""
    from .._kernels import NATIVE, kernels

    found: Callable[..., tuple[list[Any], list[int]]] | None = (
        getattr(kernels, "envelopes_decode", None) if NATIVE else None
    )
    return found


class CryptographyEngine:
    """AES-GCM through the `cryptography` package."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = keys
        self._ciphers: dict[str, Any] = {}

    def _cipher(self, key_id: str) -> Any:
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            try:
                from cryptography.hazmat.primitives.ciphers.aead import AESGCM
            except ImportError as exc:
                raise FeatureUnavailableError(
                    f"encryption needs the cryptography package ({INSTALL_HINT}); under Pyodide without it, "
                    "use the keyring's seal_async/open_async, which use WebCrypto: " + str(exc)
                ) from exc
            cipher = self._ciphers[key_id] = AESGCM(self._keys[key_id])
        return cipher

    def encrypt(self, key_id: str, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        return bytes(self._cipher(key_id).encrypt(nonce, data, aad))

    def decrypt(self, key_id: str, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        from cryptography.exceptions import InvalidTag

        cipher = self._cipher(key_id)
        try:
            return bytes(cipher.decrypt(nonce, sealed, aad))
        except InvalidTag:
            raise AuthenticationFailed from None


class WebCryptoEngine:
    """AES-GCM through WebCrypto (``crypto.subtle``), asynchronous: each call awaits a JS promise."""

    def __init__(self, keys: Mapping[str, bytes]) -> None:
        self._keys = keys
        self._imported: dict[str, Any] = {}

    async def _key(self, key_id: str) -> Any:
        key = self._imported.get(key_id)
        if key is None:
            if not webcrypto_available():
                raise FeatureUnavailableError("WebCrypto (crypto.subtle) is reached only under Pyodide")
            import js
            from pyodide.ffi import to_js

            key = await js.crypto.subtle.importKey(
                "raw", to_js(self._keys[key_id]), _js_object({"name": "AES-GCM"}), False,
                to_js(["encrypt", "decrypt"]),
            )
            self._imported[key_id] = key
        return key

    async def encrypt(self, key_id: str, nonce: bytes, data: bytes, aad: bytes) -> bytes:
        key = await self._key(key_id)  # first: it says when there is no WebCrypto
        import js
        from pyodide.ffi import to_js

        result = await js.crypto.subtle.encrypt(_gcm_params(nonce, aad), key, to_js(data))
        return bytes(result.to_bytes())

    async def decrypt(self, key_id: str, nonce: bytes, sealed: bytes, aad: bytes) -> bytes:
        key = await self._key(key_id)
        import js
        from pyodide.ffi import JsException, to_js

        try:  # an OperationError DOMException is WebCrypto's failed tag
            result = await js.crypto.subtle.decrypt(_gcm_params(nonce, aad), key, to_js(sealed))
        except JsException:
            raise AuthenticationFailed from None
        return bytes(result.to_bytes())


def _js_object(entries: dict[str, Any]) -> Any:
    import js
    from pyodide.ffi import to_js

    return to_js(entries, dict_converter=js.Object.fromEntries)


def _gcm_params(nonce: bytes, aad: bytes) -> Any:
    from pyodide.ffi import to_js

    return _js_object({"name": "AES-GCM", "iv": to_js(nonce), "additionalData": to_js(aad), "tagLength": 128})
