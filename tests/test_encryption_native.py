"""The native kernels open and decode a checkpoint's sealed rows in one call (`durable_agent_native.envelopes_decode`);
every row that call does not take goes to the reference path (`cryptography`, then the codec), which says why.

So a load gives the same checkpoint, or the same error naming the same place, whichever path ran. Checked here row by
row against a keyring that always takes the reference path (``implementation="cryptography"``), on a real SQLite
file, with every kind of row the fast path must hand back: damaged, copied, plaintext, another key, undecodable.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import durable_agent
from durable_agent import AgentCheckpoint, CheckpointCorruptError
from durable_agent.backends.sqlite import SqliteCheckpointStore
from durable_agent.encryption import DecryptionError, Keyring
from durable_agent.testing import conversation, make_checkpoint

pytestmark = [
    pytest.mark.host_only("opens SQLite files and needs cryptography and the native kernels"),
    pytest.mark.skipif(not durable_agent.NATIVE, reason="the native kernels are not active"),
]
pytest.importorskip("cryptography")

K1, K2 = bytes(range(32)), bytes(range(1, 33))
KEYS = {"k2": K2, "k1": K1}
STEPS = 40


def keyring(implementation: Any = "auto", *, strict: bool = False, keys: dict[str, bytes] = KEYS) -> Keyring:
    return Keyring(keys, primary=next(iter(keys)), implementation=implementation, strict=strict)


class Rows:
    """The SQLite file of a store and its message rows, read and written behind the store's back."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def get(self, run_id: str, seq: int) -> Any:
        with sqlite3.connect(self.path) as conn:
            return conn.execute(
                "SELECT body FROM durable_agent_messages WHERE run_id = ? AND seq = ?", (run_id, seq)
            ).fetchone()[0]

    def put(self, run_id: str, seq: int, value: Any) -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute("UPDATE durable_agent_messages SET body = ? WHERE run_id = ? AND seq = ?", (value, run_id, seq))


@pytest.fixture
def rows(tmp_path: Path) -> Iterator[Rows]:
    """Two runs of `STEPS` steps, the first half of run-b's rows under k1 and the rest under k2 (a rotation)."""
    path = tmp_path / "runs.db"
    for ring, steps in ((keyring(keys={"k1": K1}), STEPS // 2), (keyring(), STEPS)):
        store = SqliteCheckpointStore(path, encryption=ring)
        for run_id in ("run-a", "run-b"):
            store.save(make_checkpoint(run_id, steps, conversation(steps + 1)))
        store.close()
    yield Rows(path)


def outcome(path: Path, ring: Keyring, run_id: str = "run-b") -> Any:
    """What loading `run_id` gives: the checkpoint, or the error's type, place and message."""
    store = SqliteCheckpointStore(path, encryption=ring)
    try:
        return store.load(run_id)
    except (DecryptionError, CheckpointCorruptError) as exc:
        return type(exc).__name__, getattr(exc, "place", None), str(exc)
    finally:
        store.close()


def flipped(value: Any) -> Any:
    """`value` (a text or binary envelope) with its middle character or byte changed."""
    i = len(value) // 2
    if isinstance(value, bytes):
        return value[:i] + bytes([value[i] ^ 1]) + value[i + 1 :]
    return value[:i] + ("A" if value[i] != "A" else "B") + value[i + 1 :]


Damage = Callable[[Rows], None]
DAMAGE: dict[str, Damage] = {
    "none": lambda rows: None,
    "a flipped byte": lambda rows: rows.put("run-b", 7, flipped(rows.get("run-b", 7))),
    "truncated": lambda rows: rows.put("run-b", 30, rows.get("run-b", 30)[:-6]),
    "copied from another row": lambda rows: rows.put("run-b", 3, rows.get("run-b", 4)),
    "copied from another run": lambda rows: rows.put("run-b", 25, rows.get("run-a", 25)),
    "plaintext": lambda rows: rows.put("run-b", 11, '{"role":"user","content":"written before encryption"}'),
    "plaintext, not a message": lambda rows: rows.put("run-b", 11, "[1,2"),
    "sealed, undecodable": lambda rows: rows.put("run-b", 12, keyring().seal("{not json", ("checkpoint-message", "run-b", 12))),
    "sealed bytes": lambda rows: rows.put("run-b", 13, keyring().seal(b"{}", ("checkpoint-message", "run-b", 13))),
    "the text form (written before binary envelopes)": lambda rows: rows.put(
        "run-b", 17, keyring().seal('{"role":"user","content":"t"}', ("checkpoint-message", "run-b", 17))
    ),
    "the binary form": lambda rows: rows.put(
        "run-b", 14, keyring().seal('{"role":"user","content":"b"}', ("checkpoint-message", "run-b", 14), binary=True)
    ),
    "an unknown key id": lambda rows: rows.put(
        "run-b", 15, keyring(keys={"k9": bytes(32)}).seal("{}", ("checkpoint-message", "run-b", 15))
    ),
    "not text": lambda rows: rows.put("run-b", 16, 42),
}


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict"])
@pytest.mark.parametrize("damage", list(DAMAGE.values()), ids=list(DAMAGE))
def test_a_load_gives_what_the_reference_gives(rows: Rows, damage: Damage, strict: bool) -> None:
    damage(rows)
    fast = outcome(rows.path, keyring(strict=strict))
    assert fast == outcome(rows.path, keyring("cryptography", strict=strict))
    assert outcome(rows.path, keyring(strict=strict), "run-a") == make_checkpoint("run-a", STEPS, conversation(STEPS + 1))


def test_an_intact_run_loads_whole_through_one_native_call(rows: Rows, monkeypatch: pytest.MonkeyPatch) -> None:
    import durable_agent_native

    calls: list[int] = []
    real = durable_agent_native.envelopes_decode

    def counted(keys: dict[str, bytes], values: Any, place_head: bytes, first: int) -> tuple[list[Any], list[int]]:
        decoded, misses = real(keys, values, place_head, first)
        calls.append(len(misses))
        return decoded, misses

    monkeypatch.setattr(durable_agent_native, "envelopes_decode", counted)
    loaded = outcome(rows.path, keyring())
    assert isinstance(loaded, AgentCheckpoint) and loaded == make_checkpoint("run-b", STEPS, conversation(STEPS + 1))
    assert calls == [0]  # one call, every row taken by it
    assert outcome(rows.path, keyring("cryptography")) == loaded and calls == [0]  # the reference: no native call


def test_the_native_call_refuses_a_key_that_is_not_32_bytes() -> None:
    import durable_agent_native

    with pytest.raises(ValueError, match="32 bytes"):
        durable_agent_native.envelopes_decode({"k1": b"short"}, [], b'["p",', 0)
    with pytest.raises(TypeError, match="key id must be str"):
        not_str: Any = {1: K1}
        durable_agent_native.envelopes_decode(not_str, [], b'["p",', 0)
