"""Loading decodes stored messages a batch at a time (`_history.decode_batched`): same values, same errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_agent import CheckpointCorruptError
from durable_agent._kernels import kernels
from durable_agent._storage import history as _history
from durable_agent.backends.jsonl import JsonlCheckpointStore
from durable_agent.backends.sqlite import SqliteCheckpointStore
from durable_agent.testing.conformance import conversation, make_checkpoint

try:
    import sqlite3
except ImportError:  # Pyodide 0.28 ships sqlite3 only as a CDN package
    sqlite3 = None  # type: ignore[assignment]

# Values whose codec text is most likely to break when texts are joined: bytes tags, escaped
# tags, escapes inside strings, non-ASCII, containers at the edges, scalars.
TRICKY: list[Any] = [
    {"role": "user", "content": [{"type": "image", "data": b"\x00\xff" * 7, "media_type": "image/png"}]},
    {"$bytes": "not a tag: escaped"},
    {"$esc": {"$bytes": 1}},
    {"role": "assistant", "content": 'quote " backslash \\ newline \n tab \t nul \x00 , ] } ['},
    {"role": "tool", "content": "é ü 漢字 😀"},
    [],
    {},
    "a bare string",
    0,
    -1.5e300,
    None,
    True,
    [[[{"deep": [1, 2, {"x": b""}]}]]],
]


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def decode_alone(index: int, text: Any) -> Any:
    return _history.decode_message(text, "r", index)


@pytest.mark.parametrize("batch_chars", [1, 40, 1 << 16])
def test_batches_give_what_one_by_one_decoding_gives(monkeypatch: pytest.MonkeyPatch, batch_chars: int) -> None:
    monkeypatch.setattr(_history, "BATCH_CHARS", batch_chars)
    texts = [kernels.encode(value) for value in TRICKY * 3]
    assert _history.decode_batched(texts, decode_alone) == [kernels.decode(t) for t in texts] == TRICKY * 3
    assert _history.decode_batched([], decode_alone) == []


def test_a_text_nested_as_deep_as_the_codec_allows_still_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    # Inside the joined list it is one level too deep: that batch falls back to decoding one by one.
    monkeypatch.setattr(_history, "BATCH_CHARS", 1 << 20)
    texts = [kernels.encode(v) for v in ("a", nested(256), "b")]
    assert _history.decode_batched(texts, decode_alone) == ["a", nested(256), "b"]


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("", "message 7 cannot be decoded"),
        ('{"role":"user","content":"a"},{"role":"user","content":"b"}', "message 7 cannot be decoded"),
        ('{"role":"us', "message 7 cannot be decoded"),
        ('"a"]', "message 7 cannot be decoded"),
        (b'{"role":"user","content":"a"}', "message 7 is not text"),
        (7, "message 7 is not text"),
    ],
)
@pytest.mark.parametrize("batch_chars", [1, 100, 1 << 16])
def test_a_bad_text_is_named_by_its_own_index(
    monkeypatch: pytest.MonkeyPatch, bad: Any, match: str, batch_chars: int
) -> None:
    monkeypatch.setattr(_history, "BATCH_CHARS", batch_chars)
    bodies: list[Any] = [kernels.encode(m) for m in conversation(12)]
    bodies[7] = bad
    with pytest.raises(CheckpointCorruptError, match=match) as caught:
        _history.decode_messages(bodies, "r")
    assert caught.value.run_id == "r"


@pytest.mark.requires_sqlite
def test_sqlite_names_a_damaged_row_past_the_first_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_history, "BATCH_CHARS", 200)  # several batches for a 40-message run
    db = tmp_path / "s.db"
    with SqliteCheckpointStore(db) as store:
        saved = make_checkpoint("r", 3, conversation(40))
        store.save(saved)
        assert store.load("r") == saved
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE durable_agent_messages SET body = ? WHERE seq = 31",
                ('{"role":"user","content":"a"},{"role":"user","content":"b"}',),
            )
        with pytest.raises(CheckpointCorruptError, match="message 31 cannot be decoded") as caught:
            store.load("r")
        assert caught.value.run_id == "r"


def test_jsonl_names_the_offset_of_a_damaged_line_past_the_first_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_history, "BATCH_CHARS", 300)
    path = tmp_path / "s.jsonl"
    with JsonlCheckpointStore(path, fsync=False) as store:
        for step in range(30):
            store.save(make_checkpoint("r", step, conversation(step + 2)))
        assert store.load("r") == make_checkpoint("r", 29, conversation(31))
    lines = path.read_bytes().split(b"\n")
    offset = sum(len(line) + 1 for line in lines[:21])
    with JsonlCheckpointStore(path, fsync=False) as store:
        assert lines[21].endswith(b"}")
        lines[21] = lines[21][:-1] + b"]"  # same length: the live index still points at it
        path.write_bytes(b"\n".join(lines))
        with pytest.raises(CheckpointCorruptError, match=f"line at byte {offset} is unreadable") as caught:
            store.load("r")
        assert caught.value.run_id == "r"
