"""Encryption at rest: a `Keyring` of AES-256-GCM keys seals each stored value into an envelope bound to
its place (docs/encryption.md).

```python
from durable_agent.encryption import Keyring, associated_data

keyring = Keyring({"k2": key2, "k1": key1}, primary="k2")      # or Keyring.from_env()
place = ("checkpoint-message", run_id, seq)                      # where the value is stored
stored = keyring.seal(text, place)                               # 'enc1t.k2.…' (text)
assert keyring.open(stored, place) == text                      # DecryptionError anywhere else
```

An envelope carries a format marker, the id of the key that sealed it, a fresh 96-bit nonce and the
ciphertext with its tag; its associated data is the canonical encoding of the place
(`associated_data`), so a value copied to another run or row does not open. `envelope_key_id` and
`is_envelope` read an envelope's structure without decrypting it (to rekey, to migrate a plaintext
database in place). `rekey(store, keyring)` (`rekey_async` for async stores and runtimes) rewrites a
store's rows that are not under the primary key to it, batch by batch, plaintext rows included.

Importing this module uses only the standard library and draws no entropy: `cryptography` is imported
when a key is first used, and WebCrypto is reached through Pyodide's ``js`` module only when asked.
"""

from __future__ import annotations

from .._errors import DecryptionError
from ._envelope import Place, associated_data, envelope_key_id, is_envelope
from ._keyring import ENV_KEYS, ENV_PRIMARY, Keyring
from ._rekey import RekeyReport, rekey, rekey_async

__all__ = [
    "ENV_KEYS",
    "ENV_PRIMARY",
    "DecryptionError",
    "Keyring",
    "Place",
    "RekeyReport",
    "associated_data",
    "envelope_key_id",
    "is_envelope",
    "rekey",
    "rekey_async",
]
