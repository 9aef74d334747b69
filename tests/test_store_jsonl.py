"""JsonlCheckpointStore: the conformance suite, plus crash safety, damage and compaction."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from durable_agent import CheckpointCorruptError, ConfigurationError
from durable_agent.backends import decode
from durable_agent.backends.jsonl import JsonlCheckpointStore
from durable_agent.testing import CheckpointStoreConformance, conversation, make_checkpoint, message


class TestJsonlStore(CheckpointStoreConformance):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Callable[[], JsonlCheckpointStore]:
        return lambda: JsonlCheckpointStore(tmp_path / "runs.jsonl", fsync=False)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "runs.jsonl"


def test_each_save_appends_one_line_with_only_the_new_messages(path: Path) -> None:
    with JsonlCheckpointStore(path) as store:
        history = conversation(10)
        store.save(make_checkpoint("r", 1, history))
        size = path.stat().st_size
        store.save(make_checkpoint("r", 2, [*history, message(10)]))
    lines = path.read_bytes().splitlines()
    assert len(lines) == 2 and len(lines[0]) + 1 == size
    second = decode(lines[1].decode())
    assert (second["keep"], second["messages"]) == (10, [message(10)])


def test_a_torn_last_line_is_ignored_then_cut_by_the_next_writer(path: Path) -> None:
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
        store.save(make_checkpoint("other", 1, conversation(2)))
    whole = path.read_bytes()
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 2, conversation(5)))
    torn = path.read_bytes()[: len(whole) + 40]  # the crash hit in the middle of the third line
    path.write_bytes(torn)
    with JsonlCheckpointStore(path) as store:
        assert store.load("r") == make_checkpoint("r", 1, conversation(3))
        assert store.damaged_lines == []
        store.save(make_checkpoint("r", 3, conversation(6)))
    with JsonlCheckpointStore(path) as store:
        assert store.load("r") == make_checkpoint("r", 3, conversation(6))
        assert store.load("other") == make_checkpoint("other", 1, conversation(2))
    assert path.read_bytes().startswith(whole)
    assert path.read_bytes().count(b"\n") == 3


@pytest.mark.parametrize(
    ("damage", "match"),
    [
        (lambda line: line[:-30] + b"garbage", "unreadable"),
        (lambda line: line.replace(b'"keep":', b'"keep":-'), "keep"),
        (lambda line: line.replace(b'"op":"save"', b'"op":"zap"'), "unknown op"),
        (lambda line: line.replace(b'"status":"running"', b'"status":"walking"'), "header"),
        (lambda line: line[:40] + b"\xff\xfe" + line[42:], "unreadable"),
    ],
)
def test_a_damaged_line_makes_only_its_run_corrupt(
    path: Path, damage: Callable[[bytes], bytes], match: str
) -> None:
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("bad", 1, conversation(3)))
        store.save(make_checkpoint("good", 1, conversation(2)))
        store.save(make_checkpoint("bad", 2, conversation(4)))
        store.save(make_checkpoint("good", 2, conversation(3)))
    lines = path.read_bytes().split(b"\n")
    lines[2] = damage(lines[2])  # the second save of "bad"
    path.write_bytes(b"\n".join(lines))
    with JsonlCheckpointStore(path) as store:
        with pytest.raises(CheckpointCorruptError, match=match) as caught:
            store.load("bad")
        assert caught.value.run_id == "bad"
        assert store.load("good") == make_checkpoint("good", 2, conversation(3))
        with pytest.raises(CheckpointCorruptError):
            store.compact()
        healed = make_checkpoint("bad", 3, conversation(5))
        store.save(healed)
        assert store.load("bad") == healed
        store.compact()
        assert store.load("bad") == healed


def test_a_lost_line_in_a_run_is_detected(path: Path) -> None:
    with JsonlCheckpointStore(path) as store:
        for step in range(3):
            store.save(make_checkpoint("r", step, conversation(step + 2)))
    lines = path.read_bytes().split(b"\n")
    del lines[1]
    path.write_bytes(b"\n".join(lines))
    with JsonlCheckpointStore(path) as store, pytest.raises(CheckpointCorruptError, match="was lost"):
        store.load("r")


def test_an_unattributable_line_is_skipped_and_reported(path: Path) -> None:
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
    with path.open("ab") as f:
        f.write(b"\x00\x00 not json at all\n")
    with JsonlCheckpointStore(path) as store:
        assert store.damaged_lines == [path.stat().st_size - 19]
        assert store.load("r") == make_checkpoint("r", 1, conversation(3))
        store.save(make_checkpoint("r", 2, conversation(4)))
        assert store.load("r") == make_checkpoint("r", 2, conversation(4))


def test_compaction_keeps_every_run_and_shrinks_the_file(path: Path) -> None:
    with JsonlCheckpointStore(path, fsync=False) as store, JsonlCheckpointStore(path, fsync=False) as other:
        history: list[object] = []
        for step in range(30):
            history = [*history, message(step)]
            store.save(make_checkpoint("long", step, history if step % 10 else history[:1]))
            store.save(make_checkpoint(f"short-{step % 3}", step, conversation(2)))
        store.delete("short-0")
        expected = {r: store.load(r) for r in store.list()}
        before = path.stat().st_size
        store.compact()
        assert path.stat().st_size < before
        assert path.read_bytes().count(b"\n") == 3
        assert {r: store.load(r) for r in store.list()} == expected
        assert {r: other.load(r) for r in other.list()} == expected  # sees the new file
        other.save(make_checkpoint("long", 99, [*expected["long"].messages, message(99)]))  # type: ignore[union-attr]
        assert store.load("long").step_index == 99  # type: ignore[union-attr]


def test_an_unusable_path_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError):
        JsonlCheckpointStore(tmp_path / "no-such-dir" / "runs.jsonl")


_WRITER = """
import sys
sys.path.insert(0, {python!r})
from durable_agent.backends.jsonl import JsonlCheckpointStore
from durable_agent.testing import make_checkpoint, conversation
store = JsonlCheckpointStore({path!r}, fsync=False)
worker = int(sys.argv[1])
for step in range(40):
    store.save(make_checkpoint(f"w{{worker}}", step, conversation(step + 1)))
    store.save(make_checkpoint("shared", step, conversation(step % 7 + 1)))
    if worker == 0 and step == 20:
        store.compact()
store.close()
"""


@pytest.mark.host_only("spawns processes")
def test_several_processes_append_to_one_file(path: Path) -> None:
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    script = _WRITER.format(python=python_dir, path=str(path))
    procs = [subprocess.Popen([sys.executable, "-c", script, str(w)]) for w in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    with JsonlCheckpointStore(path) as store:
        for w in range(3):
            assert store.load(f"w{w}") == make_checkpoint(f"w{w}", 39, conversation(40))
        shared = store.load("shared")
        assert shared is not None and shared.step_index == 39
        assert shared.messages == conversation(39 % 7 + 1)
        assert store.damaged_lines == []


@pytest.mark.host_only("POSIX file modes and symlinks")
def test_the_file_is_created_owner_only_and_compaction_keeps_its_mode(path: Path) -> None:
    import os

    old = os.umask(0o022)
    try:
        with JsonlCheckpointStore(path) as store:
            store.save(make_checkpoint("r", 1, conversation(2)))
            assert path.stat().st_mode & 0o777 == 0o600
            store.compact()
            assert path.stat().st_mode & 0o777 == 0o600
            path.chmod(0o640)
            store.compact()
            assert path.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)


@pytest.mark.host_only("POSIX symlinks")
def test_compaction_never_writes_through_a_planted_symlink(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    victim = path.parent / "victim.txt"
    victim.write_text("precious")
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 1, conversation(3)))
        # the name an older version used, predictable from the pid
        (path.parent / f"{path.name}.compact-{os.getpid()}").symlink_to(victim)
        store.compact()
        assert victim.read_text() == "precious"
        assert store.load("r") == make_checkpoint("r", 1, conversation(3))
        # even a symlink planted at the exact name chosen is refused, not followed
        monkeypatch.setattr(os, "urandom", lambda n: b"\x01" * n)
        (path.parent / f"{path.name}.compact-{'01' * 8}").symlink_to(victim)
        with pytest.raises(FileExistsError):
            store.compact()
        assert victim.read_text() == "precious"
        assert store.load("r") == make_checkpoint("r", 1, conversation(3))


def test_a_damaged_line_naming_an_unknown_run_makes_up_no_run(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 1, conversation(2)))
    with path.open("ab") as f:
        f.write(b'{"run_id":"phantom","op":"save" garbage\n')
    with JsonlCheckpointStore(path) as store:
        assert store.list() == ["r"]
        assert store.load("phantom") is None
        assert store.damaged_lines == [path.stat().st_size - 40]
        assert "'phantom', unknown before it" in caplog.text
        store.compact()
        assert store.list() == ["r"] and store.damaged_lines == []


def test_a_zero_filled_newest_line_rolls_its_run_back_with_a_warning(
    path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with JsonlCheckpointStore(path) as store:
        store.save(make_checkpoint("r", 1, conversation(2)))
        size = path.stat().st_size
        store.save(make_checkpoint("r", 2, conversation(3)))
    data = path.read_bytes()
    path.write_bytes(data[:size] + b"\x00" * (len(data) - size))  # the newest line and its newline
    with JsonlCheckpointStore(path) as store:
        assert store.load("r") == make_checkpoint("r", 1, conversation(2))
        assert store.load("r") == make_checkpoint("r", 1, conversation(2))
        warnings = [r for r in caplog.records if "zeros" in r.getMessage()]
        assert len(warnings) == 1 and "previous save" in warnings[0].getMessage()
        store.save(make_checkpoint("r", 3, conversation(4)))
    with JsonlCheckpointStore(path) as store:
        assert store.load("r") == make_checkpoint("r", 3, conversation(4))
    assert b"\x00" not in path.read_bytes()


_TEARING_SAVE = """
import os, signal, sys
sys.path.insert(0, {python!r})
from durable_agent.backends import jsonl
from durable_agent.testing import conversation, make_checkpoint

def torn(fd, data):  # the process dies a third of the way into writing its line
    os.write(fd, data[: len(data) // 3])
    os.kill(os.getpid(), signal.SIGKILL)

jsonl._write_all = torn
jsonl.JsonlCheckpointStore({path!r}).save(make_checkpoint({run_id!r}, 0, conversation(6)))
"""

_SAVE = """
import sys
sys.path.insert(0, {python!r})
from durable_agent.backends.jsonl import JsonlCheckpointStore
from durable_agent.testing import conversation, make_checkpoint

with JsonlCheckpointStore({path!r}) as store:
    store.save(make_checkpoint("Y", 1, conversation(12)))
"""


class _ReaderDelayedBetweenReads(JsonlCheckpointStore):
    """A reader that, once a read of its catch-up ends without a newline, waits for `between` (another
    process's save) before reading on: what a reader descheduled between two reads meets."""

    between: Callable[[], object] | None = None

    def _read_at(self, offset: int, size: int) -> bytes:
        chunk = super()._read_at(offset, size)
        if chunk and not chunk.endswith(b"\n") and self.between is not None:
            between, self.between = self.between, None
            between()
        return chunk


@pytest.mark.host_only("spawns processes")
@pytest.mark.parametrize("torn_run", ["Z", "X"], ids=["a-new-run-tore", "a-healthy-run-tore"])
def test_a_reader_never_splices_a_torn_line_with_the_save_that_cut_it(path: Path, torn_run: str) -> None:
    """A writer killed mid-line leaves a torn tail; between a reader's two reads another process cuts it off
    and writes a longer line at its offset. The reader used to join the torn bytes with the new line's
    tail: a line no save wrote. Naming a new run it was skipped as damage, and the reader never saw Y's
    save (it loaded step 0, and its compact() rolled Y back for every process); naming a stored run it
    made that healthy run corrupt."""
    python_dir = str(Path(__file__).resolve().parent.parent / "python")
    x0, y0, y1 = (make_checkpoint("X", 0, conversation(2)), make_checkpoint("Y", 0, conversation(2)),
                  make_checkpoint("Y", 1, conversation(12)))
    with JsonlCheckpointStore(path) as writer:
        writer.save(x0)
        writer.save(y0)
    reader = _ReaderDelayedBetweenReads(path)
    with reader:
        tearing = _TEARING_SAVE.format(python=python_dir, path=str(path), run_id=torn_run)
        assert subprocess.run([sys.executable, "-c", tearing], timeout=120).returncode == -9
        assert not path.read_bytes().endswith(b"\n")
        save = _SAVE.format(python=python_dir, path=str(path))
        reader.between = lambda: subprocess.run([sys.executable, "-c", save], timeout=120, check=True)
        assert reader.load("Y") in (y0, y1)  # a load overlapping the save sees it or the save before
        assert reader.between is None  # the other process's save ran between two reads
        assert reader.load("X") == x0
        assert reader.load("Y") == y1  # that save was acknowledged before this load began
        assert reader.damaged_lines == []
        reader.compact()
    with JsonlCheckpointStore(path) as fresh:
        assert (fresh.list(), fresh.load("X"), fresh.load("Y")) == (["X", "Y"], x0, y1)
