"""The envelope's format and the associated data, with no cryptography (docs/encryption.md).

```
envelope = "enc1" form "." key_id "." base64( nonce[12] || ciphertext || tag[16] )      (text)
         | ASCII( "enc1" form "." key_id "." ) || nonce[12] || ciphertext || tag[16]     (binary)
form     = "t" (the plaintext was text, stored as UTF-8) | "b" (bytes)
key_id   = 1 to 64 of A-Z a-z 0-9 - _
GCM AAD  = ASCII( "enc1" form "." key_id "." ) || associated_data(place)
```

`base64` is RFC 4648 section 4 (alphabet ``A-Z a-z 0-9 + /``, ``=`` padding), canonical: a reader accepts
exactly what the writer produces. Not the URL-safe alphabet of the approval tokens: an envelope is stored,
never put in a URL, and CPython's binascii reads and writes the standard alphabet 2-3x faster (64 KiB values).
The binary form is the same envelope without the base64 (the same AAD: one converts to the other without
decrypting), for stores that hold bytes; base64 costs more than AES-GCM itself on large values.
"""

from __future__ import annotations

import binascii
import re
from json.encoder import encode_basestring
from typing import NamedTuple

from .._errors import CodecError, ConfigurationError, DecryptionError

MARKER = "enc1"
_BINARY_MARKER = MARKER.encode("ascii")
NONCE_BYTES = 12
TAG_BYTES = 16
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
_HEADER = re.compile(r"enc1([tb])\.([A-Za-z0-9_-]{1,64})\.")
_BINARY_HEADER = re.compile(rb"enc1([tb])\.([A-Za-z0-9_-]{1,64})\.")

Plaintext = str | bytes | bytearray
Place = tuple[str | int, ...] | list[str | int]
"""Where a value is stored, e.g. ``("checkpoint-message", run_id, seq)``: strs and ints, kind first."""


def associated_data(place: Place) -> bytes:
    """The canonical bytes of `place` that an envelope is bound to: its compact JSON array, UTF-8.

    `place` is a tuple (or list) of `str` and `int` parts (no bools), so ``3`` and ``"3"`` are different
    places. Strings are written as ``json.dumps(..., ensure_ascii=False)`` writes them. A place the function
    cannot encode is a `ConfigurationError`: it is the caller's mistake.
    """
    if (type(place) is not tuple and type(place) is not list) or not place:
        what = f"a {type(place).__name__}" if place else "empty"
        raise ConfigurationError(f"a place is a non-empty tuple of str and int parts; this one is {what}")
    try:
        return ("[" + ",".join([_part(part) for part in place]) + "]").encode("utf-8")
    except (UnicodeEncodeError, ValueError) as exc:  # a lone surrogate; an int beyond the digit limit
        raise ConfigurationError(f"a part of the place cannot be encoded: {exc}") from None


def _part(part: object) -> str:
    if type(part) is str:
        return encode_basestring(part)
    if type(part) is int:
        return repr(part)
    raise ConfigurationError(f"a place holds only str and int parts, not {type(part).__name__}")


def header(form: str, key_id: str) -> str:
    return f"{MARKER}{form}.{key_id}."


def plaintext_bytes(plaintext: Plaintext) -> tuple[str, bytes]:
    """(form, bytes) of a plaintext: text as UTF-8, bytes as they are."""
    if isinstance(plaintext, str):
        try:
            return "t", plaintext.encode("utf-8")
        except UnicodeEncodeError:
            raise CodecError("the plaintext holds a lone surrogate, which UTF-8 cannot store") from None
    if isinstance(plaintext, (bytes, bytearray, memoryview)):
        return "b", bytes(plaintext)
    raise CodecError(f"a plaintext is str or bytes, not {type(plaintext).__name__}")


def build(form: str, key_id: str, nonce: bytes, sealed: bytes) -> str:
    return header(form, key_id) + binascii.b2a_base64(nonce + sealed, newline=False).decode("ascii")


def build_binary(form: str, key_id: str, nonce: bytes, sealed: bytes) -> bytes:
    return header(form, key_id).encode("ascii") + nonce + sealed


_BASE64_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_BASE64_INDEX = {char: i for i, char in enumerate(_BASE64_ALPHABET)}


def base64_decode(text: str) -> bytes | None:
    """Canonical padded base64 (what `build` writes) to bytes; None for any other text."""
    if len(text) % 4 or "=" in text[:-2]:
        return None
    padding = 2 if text.endswith("==") else 1 if text.endswith("=") else 0
    if padding and _BASE64_INDEX.get(text[-1 - padding], 1) & (0b1111 if padding == 2 else 0b11):
        return None  # the last character's unused bits are not zero
    try:  # strict: no character outside the alphabet, no padding but at the end
        return binascii.a2b_base64(text, strict_mode=True)
    except (binascii.Error, ValueError):
        return None


class Envelope(NamedTuple):
    """A parsed envelope: its header text (authenticated with the place), the nonce and ciphertext+tag."""

    form: str
    key_id: str
    header: str
    nonce: bytes
    sealed: bytes


def parse(value: object) -> Envelope | None:
    """The envelope `value` holds (a str: the text form; bytes: the binary form), or None if none."""
    if isinstance(value, str):
        found = _HEADER.match(value)
        if found is None:
            return None
        body = base64_decode(value[found.end():])
        if body is None or len(body) < NONCE_BYTES + TAG_BYTES:
            return None
        return Envelope(found[1], found[2], found[0], body[:NONCE_BYTES], body[NONCE_BYTES:])
    if isinstance(value, (bytes, bytearray, memoryview)):
        data = bytes(value)
        binary = _BINARY_HEADER.match(data)
        if binary is None or len(data) - binary.end() < NONCE_BYTES + TAG_BYTES:
            return None
        start = binary.end() + NONCE_BYTES
        return Envelope(chr(binary[1][0]), binary[2].decode("ascii"), binary[0].decode("ascii"),
                        data[binary.end():start], data[start:])
    return None


def marked(value: object) -> bool:
    """Whether `value` starts with the envelope marker: text, or bytes (the binary form). What a store takes for
    sealed (anything else is plaintext, or damage); it says nothing of whether the rest is a well-formed envelope."""
    if isinstance(value, str):
        return value.startswith(MARKER)
    return isinstance(value, (bytes, bytearray, memoryview)) and bytes(value[:4]) == _BINARY_MARKER


def parse_or_raise(value: object, place: Place) -> Envelope:
    envelope = parse(value)
    if envelope is not None:
        return envelope
    if not isinstance(value, (str, bytes, bytearray, memoryview)):
        problem = f"it is of type {type(value).__name__}, not an envelope (text or bytes)"
    elif marked(value):
        problem = "the envelope is malformed (truncated or altered)"
    else:
        problem = f"it is not an envelope (no {MARKER!r} marker: plaintext, or another format)"
    raise DecryptionError(tuple(place), problem)


def envelope_key_id(value: object) -> str | None:
    """The id of the key that sealed `value` when it is an envelope (text or binary), else None (plaintext,
    anything else).

    Structural only (nothing is decrypted): what rekeying reads to find the rows not yet under the
    primary key, and migrating a plaintext database in place to find the rows not yet sealed.
    """
    envelope = parse(value)
    return envelope.key_id if envelope is not None else None


def is_envelope(value: object) -> bool:
    """True when `value` is an envelope by its structure (see `envelope_key_id`)."""
    return parse(value) is not None


def valid_key_id(key_id: object) -> bool:
    return isinstance(key_id, str) and KEY_ID_PATTERN.fullmatch(key_id) is not None
