"""Loading decodes stored messages a batch at a time (one codec call per ~64K characters): same values, same errors.

Checked through the stores that batch: the SQL stores decode a run's message rows in batches, the JSONL
store its lines. Filler messages of a chosen size set how many texts a batch joins (every text in one
batch, about ten per batch, or one per batch), as the batch size is about 64K characters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from durable_agent import AgentCheckpoint, CheckpointCorruptError
from durable_agent.backends import encode
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
FILLERS = {"one-batch": 0, "ten-per-batch": 6_000, "one-per-batch": 70_000}


def nested(depth: int) -> Any:
    value: Any = 0
    for _ in range(depth):
        value = [value]
    return value


def tool_result(index: int, output: Any) -> dict[str, Any]:
    return {"role": "tool", "content": [{"type": "tool-result", "tool_call_id": f"c{index}", "tool_name": "t",
                                         "output": output}]}


def with_fillers(messages: list[Any], filler: int) -> list[Any]:
    """`messages`, each followed by a text message of `filler` characters (none when 0)."""
    pad = [{"role": "user", "content": "f" * filler}] if filler else []
    return [m for message in messages for m in (message, *pad)]


def saved_and_loaded(path: Path, checkpoint: AgentCheckpoint) -> AgentCheckpoint | None:
    with SqliteCheckpointStore(path) as store:
        store.save(checkpoint)
    with SqliteCheckpointStore(path) as store:
        return store.load(checkpoint.run_id)


@pytest.mark.requires_sqlite
@pytest.mark.parametrize("filler", FILLERS.values(), ids=FILLERS.keys())
def test_batches_give_what_one_by_one_decoding_gives(tmp_path: Path, filler: int) -> None:
    messages = with_fillers([tool_result(i, value) for i, value in enumerate(TRICKY * 3)], filler)
    checkpoint = make_checkpoint("r", 1, messages)
    assert saved_and_loaded(tmp_path / "s.db", checkpoint) == checkpoint


@pytest.mark.requires_sqlite
def test_a_text_nested_as_deep_as_the_codec_allows_still_loads(tmp_path: Path) -> None:
    # Inside the joined list it is one level too deep: that batch falls back to decoding one by one.
    deepest = max(d for d in range(240, 262) if encodable(tool_result(0, nested(d))))
    with pytest.raises(Exception, match="deep"):
        encode(tool_result(0, nested(deepest + 1)))
    checkpoint = make_checkpoint("r", 1, [tool_result(0, "a"), tool_result(1, nested(deepest)), tool_result(2, "b")])
    assert saved_and_loaded(tmp_path / "s.db", checkpoint) == checkpoint


def encodable(value: Any) -> bool:
    try:
        encode(value)
    except ValueError:
        return False
    return True


@pytest.mark.requires_sqlite
@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ("", "message 7 cannot be decoded"),
        ('{"role":"user","content":"a"},{"role":"user","content":"b"}', "message 7 cannot be decoded"),
        ('{"role":"us', "message 7 cannot be decoded"),
        ('"a"]', "message 7 cannot be decoded"),
        (b'{"role":"user","content":"a"}', "message 7 is not text"),
        (7, "every message must be an object"),  # the column's text affinity stores the text "7"
    ],
)
@pytest.mark.parametrize("filler", [70_000, 600, 0], ids=["one-per-batch", "a-few-per-batch", "one-batch"])
def test_a_bad_text_is_named_by_its_own_index(tmp_path: Path, bad: Any, match: str, filler: int) -> None:
    """The messages are rows 0-11 (with a filler in each, so a batch joins as many as the filler allows)."""
    messages = [{**m, "content": f"{m['content']} {'f' * filler}"} for m in conversation(12)]
    db = tmp_path / "s.db"
    with SqliteCheckpointStore(db) as store:
        store.save(make_checkpoint("r", 1, messages))
        with sqlite3.connect(db) as conn:
            assert conn.execute("UPDATE durable_agent_messages SET body = ? WHERE seq = 7", (bad,)).rowcount == 1
        with pytest.raises(CheckpointCorruptError, match=match) as caught:
            store.load("r")
    assert caught.value.run_id == "r"


@pytest.mark.requires_sqlite
def test_sqlite_names_a_damaged_row_past_the_first_batch(tmp_path: Path) -> None:
    db = tmp_path / "s.db"
    with SqliteCheckpointStore(db) as store:
        saved = make_checkpoint("r", 3, with_fillers(conversation(20), 6_000))  # about 10 rows per batch
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


def test_jsonl_names_the_offset_of_a_damaged_line_past_the_first_batch(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    history = [{**m, "content": f"{m['content']} {'f' * 6_000}"} for m in conversation(31)]  # ~10 lines per batch
    with JsonlCheckpointStore(path, fsync=False) as store:
        for step in range(30):
            store.save(make_checkpoint("r", step, history[: step + 2]))
        assert store.load("r") == make_checkpoint("r", 29, history)
    lines = path.read_bytes().split(b"\n")
    offset = sum(len(line) + 1 for line in lines[:21])
    with JsonlCheckpointStore(path, fsync=False) as store:
        assert lines[21].endswith(b"}")
        lines[21] = lines[21][:-1] + b"]"  # same length: the live index still points at it
        path.write_bytes(b"\n".join(lines))
        with pytest.raises(CheckpointCorruptError, match=f"line at byte {offset} is unreadable") as caught:
            store.load("r")
        assert caught.value.run_id == "r"
