"""Encryption at rest: seal and open time per value, beside the codec's encode/decode of the same value.

What a store will do per row once encryption is wired in: encode the value with the codec, then seal the
text (and on load: open, then decode). So the figure that matters is the seal (open) time as a share of
the encode (decode) time of the same value, the context for the per-step target (<= 1.15x) that the
wiring is measured against later. Anchors, timed in the same process: the codec (the pure kernels, and
the native ones when installed); the floor, one raw ``AESGCM.encrypt``/``decrypt`` of the same bytes; and
the envelope body's base64 alone (binascii, both ways), which is most of what `Keyring.seal`/`open` add on
top of AES-GCM for large values (the rest: the nonce, the associated data, the header). Both envelope
forms are timed: text (base64 body) and binary (``seal(..., binary=True)``, raw body, for stores of bytes).

Values: a small one (one chat message, about 200 bytes of codec text) and a 64 KiB one (a tool result
holding 64 KiB of text). Every figure is the best of many short repeats, in microseconds per value; the
ratios are (codec + envelope) / codec for each kernel.

Run: ``.venv/bin/python benches/bench_encryption.py`` (needs ``pip install 'durable-agent[crypto]'``).
"""

from __future__ import annotations

import binascii
import os
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from durable_agent import _pure
from durable_agent.encryption import Keyring, associated_data

REPEATS = 30
KEY = bytes(range(32))
PLACE = ("checkpoint-message", "run-01HZX3K9Q4", 17)
VALUES: dict[str, Any] = {
    "small (one message)": {
        "role": "assistant",
        "content": [{"type": "text", "text": "The invoice total is 42 EUR; both invoices are ready to send."},
                    {"type": "tool-call", "toolCallId": "toolu_01A09q90", "toolName": "send_invoice",
                     "input": {"id": "inv-7", "to": "billing@example.com"}}],
    },
    "64 KiB (a tool result)": {
        "role": "tool",
        "content": [{"type": "tool-result", "toolCallId": "toolu_01A09q90", "toolName": "read_file",
                     "output": {"type": "text", "value": ("lorem ipsum dolor sit amet " * 2428)[:65536]}}],
    },
}


def per_call_us(fn: Callable[[], Any]) -> float:
    """Best-of-REPEATS time of one call, in microseconds, over short loops (~0.02 s each): on a shared
    machine the best of many short loops finds the quiet moments that a few long ones miss."""
    timer = timeit.Timer(fn)
    number, _ = timer.autorange()
    number = max(1, number // 10)
    return min(timer.repeat(repeat=REPEATS, number=number)) / number * 1e6


def codecs() -> list[tuple[str, Any]]:
    """The codec kernels to compare with: pure always, native when the extension is installed."""
    found: list[tuple[str, Any]] = [("pure", _pure)]
    try:
        import durable_agent_native
    except ImportError:
        return found
    return [("native", durable_agent_native), *found]


def main() -> None:
    keyring = Keyring({"k1": KEY}, primary="k1")
    aesgcm = AESGCM(KEY)
    nonce, aad = os.urandom(12), associated_data(PLACE)
    print(f"Python {sys.version.split()[0]}; us per value, best of {REPEATS} short loops. 'enc+seal' is "
          "(encode + seal) / encode, 'open+dec' (open + decode) / decode")
    print(f"{'value':24} {'form':6} {'codec':6} {'text B':>7} {'stored':>7} {'encode':>8} {'seal':>8} "
          f"{'enc+seal':>9} {'decode':>8} {'open':>8} {'open+dec':>9}")
    floors: list[str] = []
    for name, value in VALUES.items():
        text = _pure.encode(value)
        data = text.encode("utf-8")
        sealed = aesgcm.encrypt(nonce, data, aad)
        body = binascii.b2a_base64(nonce + sealed, newline=False)
        floors.append(
            f"{name:24} AESGCM encrypt {per_call_us(lambda: aesgcm.encrypt(nonce, data, aad)):7.2f}, "
            f"decrypt {per_call_us(lambda: aesgcm.decrypt(nonce, sealed, aad)):7.2f}; base64 of the body: "
            f"encode {per_call_us(lambda: binascii.b2a_base64(nonce + sealed, newline=False)):7.2f}, "
            f"decode {per_call_us(lambda: binascii.a2b_base64(body, strict_mode=True)):7.2f}"
        )
        codec_times: list[tuple[str, float, float]] = []
        for label, codec in codecs():
            assert codec.encode(value) == text and codec.decode(text) == value
            encode = per_call_us(lambda: codec.encode(value))
            codec_times.append((label, encode, per_call_us(lambda: codec.decode(text))))
        for form, binary in (("text", False), ("binary", True)):
            stored = keyring.seal(text, PLACE, binary=binary)
            assert keyring.open(stored, PLACE) == text
            seal = per_call_us(lambda: keyring.seal(text, PLACE, binary=binary))
            opened = per_call_us(lambda: keyring.open(stored, PLACE))
            for label, encode, decode in codec_times:
                print(f"{name:24} {form:6} {label:6} {len(data):7} {len(stored):7} {encode:8.2f} {seal:8.2f} "
                      f"{(encode + seal) / encode:8.2f}x {decode:8.2f} {opened:8.2f} "
                      f"{(decode + opened) / decode:8.2f}x")
    print("floors, us:")
    print("\n".join(floors))


if __name__ == "__main__":
    main()
