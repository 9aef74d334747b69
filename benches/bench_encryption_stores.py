"""Encryption at rest in a checkpoint store: per-save time and load (decode) time with and without a keyring.

The SQLite checkpoint store, the fixture of benches/bench_stores.py (each step adds an assistant message with a
tool call and the tool's ~2 KB result). Two figures, each side by side, plaintext vs ``encryption=keyring``:

* per save: a run of `STEPS` steps saved one step at a time (each save appends two message rows, writes the
  header and its step-log entry), median microseconds per save over the run; with ``synchronous=FULL``
  (the default: an fsync per commit) and ``NORMAL`` (no fsync: the CPU cost shows);
* load: a fresh handle loading a 1,000-step run (2,001 messages), best of `LOADS`; and the decoding alone
  (the rows already read: `RowSealer.rebuild`), best of `DECODES`; plaintext and encrypted called in turn.
  SQLite stores a checkpoint's message rows as binary envelopes (no base64); the other backends as text.

With the native kernels, an encrypted load opens and decodes all the message rows in one call
(`durable_agent_native.envelopes_decode`); with the pure kernels (``DURABLE_AGENT_NATIVE=0``), each row is opened
with `cryptography`, then decoded.

Targets (issue 24): decoding a 1,000-step checkpoint <= 1.3x; a step of an `Agent` on the SQLite runtime
<= 1.15x is benches/bench_encryption_runtime.py's.

Run: ``.venv/bin/python benches/bench_encryption_stores.py`` (needs ``pip install 'durable-agent[crypto]'``).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_stores import checkpoint, step_messages

from durable_agent import NATIVE, AgentCheckpoint
from durable_agent._storage.sealing import RowSealer, row_sealer
from durable_agent.backends.sqlite import SqliteCheckpointStore
from durable_agent.encryption import Keyring

STEPS = 300
LOAD_STEPS = 1_000
LOADS = 15
DECODES = 60
KEYRING = Keyring({"k1": bytes(range(32))}, primary="k1")


def history(steps: int) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find the invoices"}]
    for step in range(1, steps + 1):
        messages += step_messages(step)
    return messages


def per_save_us(path: Path, keyring: Keyring | None, synchronous: Literal["FULL", "NORMAL"]) -> float:
    """Median time of one save over a run of `STEPS` steps, each appending one step to the same history."""
    store = SqliteCheckpointStore(path, encryption=keyring, synchronous=synchronous)
    messages: list[dict[str, Any]] = [{"role": "user", "content": "find the invoices"}]
    times = []
    for step in range(1, STEPS + 1):
        messages = [*messages, *step_messages(step)]
        cp = checkpoint("run", step, messages)
        start = time.perf_counter()
        store.save(cp)
        times.append(time.perf_counter() - start)
    store.close()
    return statistics.median(times) * 1e6


def best_ms(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(LOADS):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1e3


def interleaved_best_ms(fns: dict[str, Callable[[], Any]], rounds: int) -> dict[str, float]:
    """The best time of each of `fns`, in ms, over `rounds` rounds that call each once in turn: a busy moment
    of a shared machine hits them all, so their ratio holds where their absolute times do not."""
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - start)
    return {name: seconds * 1e3 for name, seconds in best.items()}


def stored(path: Path, keyring: Keyring | None) -> AgentCheckpoint:
    """A `LOAD_STEPS`-step run saved at `path`."""
    cp = checkpoint("big", LOAD_STEPS, history(LOAD_STEPS))
    store = SqliteCheckpointStore(path, encryption=keyring)
    store.save(cp)
    store.close()
    return cp


def loading(path: Path, keyring: Keyring | None, cp: AgentCheckpoint) -> Callable[[], None]:
    """A load of the run at `path` by a fresh handle."""

    def load() -> None:
        fresh = SqliteCheckpointStore(path, encryption=keyring)
        assert fresh.load("big") == cp
        fresh.close()

    return load


def decoding(keyring: Keyring | None, cp: AgentCheckpoint, binary: bool = False) -> Callable[[], Any]:
    """The decoding alone of the rows of `cp` (already read): `RowSealer.rebuild`; `binary`: the message rows are
    binary envelopes, as SQLite stores them, else text envelopes, as Postgres, Redis and the others do."""
    sealer: RowSealer = row_sealer(keyring, binary_messages=binary)
    header, bodies = sealer.header_row(cp), sealer.message_rows("big", cp.messages)
    assert sealer.rebuild("big", LOAD_STEPS, header, bodies) == cp
    return lambda: sealer.rebuild("big", LOAD_STEPS, header, bodies)


def main() -> None:
    kernel = "native kernels: one call opens and decodes the rows" if NATIVE else "pure kernels: cryptography per row"
    print(f"Python {sys.version.split()[0]}; SQLite checkpoint store; plaintext vs encryption=keyring (AES-256-GCM); "
          f"{kernel}")
    with tempfile.TemporaryDirectory() as tmp:
        for synchronous in ("FULL", "NORMAL"):  # type: Literal["FULL", "NORMAL"]
            figures: dict[str, list[float]] = {"plain": [], "sealed": []}
            for round_ in range(3):  # interleaved, so a busy moment of the machine hits both
                for name, keyring in (("plain", None), ("sealed", KEYRING)):
                    figures[name].append(per_save_us(Path(tmp, f"s-{synchronous}-{name}-{round_}.db"), keyring,
                                                     synchronous))
            plain, sealed = min(figures["plain"]), min(figures["sealed"])
            print(f"per save ({STEPS} steps, synchronous={synchronous}): plaintext {plain:8.1f} us, "
                  f"encrypted {sealed:8.1f} us: {sealed / plain:.2f}x")
        cp = stored(Path(tmp, "load-plain.db"), None)
        stored(Path(tmp, "load-sealed.db"), KEYRING)
        loads = interleaved_best_ms({"plain": loading(Path(tmp, "load-plain.db"), None, cp),
                                     "sealed": loading(Path(tmp, "load-sealed.db"), KEYRING, cp)}, LOADS)
        print(f"load of a {LOAD_STEPS}-step run ({2 * LOAD_STEPS + 1} messages): plaintext {loads['plain']:7.1f} ms, "
              f"encrypted {loads['sealed']:7.1f} ms: {loads['sealed'] / loads['plain']:.2f}x")
        decodes = interleaved_best_ms({"plain": decoding(None, cp), "binary": decoding(KEYRING, cp, binary=True),
                                       "text": decoding(KEYRING, cp)}, DECODES)
        print(f"  decoding alone: plaintext {decodes['plain']:7.1f} ms; encrypted, binary envelopes (SQLite) "
              f"{decodes['binary']:7.1f} ms: {decodes['binary'] / decodes['plain']:.2f}x; text envelopes (Postgres, "
              f"Redis, JSONL, DO) {decodes['text']:7.1f} ms: {decodes['text'] / decodes['plain']:.2f}x (target <= 1.3x)")

if __name__ == "__main__":
    main()
