"""How a store saves a run's history: each step's save appends what the step added, a rewritten history is
caught and replaced, and a run does not keep its earlier steps' histories alive.

The loop builds each history by appending to the one before and names that one (weakly); a store that saved
that very list appends without comparing the two, else it compares them (pointers at C speed while the
messages are the same objects, then message by message). How much that costs a save is speed:
benches/bench_stores.py measures the save cost at steps 10 to 10,000 of a run."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent_kit import user
from durable_agent import (
    AgentCheckpoint,
    InMemoryCheckpointStore,
    Message,
    PrepareStepContext,
    ScriptedModel,
    Tool,
    Usage,
    call,
    generate_text,
    reply,
)
from durable_agent.backends.sqlite import SqliteCheckpointStore

COUNT = Tool(description="count", parameters={"type": "object"}, execute=lambda args: args["i"])


def counting(steps: int, answer: str = "done") -> ScriptedModel:
    """A model that calls the tool at each of `steps` steps (each call its own input), then answers."""
    return ScriptedModel([*(reply("", call("count", {"i": i})) for i in range(steps)), answer])


class WatchedStore(InMemoryCheckpointStore):
    """The reference store, noting (weakly) each history it is handed."""

    def __init__(self) -> None:
        super().__init__()
        self.histories: list[weakref.ref[Any]] = []

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        self.histories.append(weakref.ref(checkpoint.messages))
        super().save(checkpoint, expected_step_index=expected_step_index)


async def test_a_run_keeps_no_earlier_steps_history_alive() -> None:
    """Each step's history is built from the last; what it keeps of the last (the proof a store appends on)
    is a weak reference, so a long run holds one history, not every step's."""
    store = WatchedStore()
    result = await generate_text(model=counting(5), messages=[user("go")], tools={"count": COUNT}, store=store,
                                 run_id="r")
    assert len(result.steps) == 6
    gc.collect()
    assert [history() is not None for history in store.histories] == [False] * 5 + [True]  # the store holds the last


def checkpoint(messages: Any, step: int) -> AgentCheckpoint:
    return AgentCheckpoint(run_id="r", step_index=step, status="running", messages=messages, usage=Usage(),
                           created_at=0)


Store = InMemoryCheckpointStore | SqliteCheckpointStore


@pytest.fixture(params=["memory", pytest.param("sqlite", marks=pytest.mark.requires_sqlite)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        yield InMemoryCheckpointStore()
        return
    with SqliteCheckpointStore(str(tmp_path / "h.db")) as opened:
        yield opened


async def test_a_store_saves_each_steps_appended_history_and_catches_a_rewrite_of_it(store: Store) -> None:
    """A run's saves append a step's messages to the last save's; then the caller rewrites the history (a
    summary in place of the steps), which the store must see, not take for an append; the run goes on from
    the summary."""
    first = await generate_text(model=counting(3), messages=[user("go")], tools={"count": COUNT}, store=store,
                                run_id="r")
    lengths = [3, 5, 7, 8]  # the prompt, then each step's call and result, and the answer
    for step, length in enumerate(lengths):
        saved = store.load_step("r", step)
        assert saved is not None and list(saved.messages) == list(first.messages[:length]), step
    summary: list[Message] = [user("go"), {"role": "assistant", "content": "counted 0, 1 and 2"}]
    store.save(checkpoint(summary, 4))
    latest = store.load("r")
    assert latest is not None and list(latest.messages) == summary
    assert [store.load_step("r", step) for step in range(4)] == [None] * 4  # none is a prefix of the summary
    more = await generate_text(model=ScriptedModel(lambda request: "counted"), messages=[*summary, user("again")],
                               tools={"count": COUNT}, store=store, run_id="r")
    latest, rewritten = store.load("r"), store.load_step("r", 4)
    answered = [*summary, user("again"), {"role": "assistant", "content": [{"type": "text", "text": "counted"}]}]
    assert latest is not None and latest.step_index == 5 and list(latest.messages) == list(more.messages) == answered
    assert rewritten is not None and list(rewritten.messages) == summary


async def test_a_rewrite_saved_between_two_of_the_loops_saves_is_not_taken_for_an_append(store: Store) -> None:
    """Before the answer's step, a hook saves the run again with a summary in place of its first message (the
    other message objects kept). The loop's last history is built by appending to the one it saved before,
    not to what the store saved last: the store compares the two and stores the loop's history whole, and
    the step the hook saved, not a prefix of it, is gone."""

    def summarise(context: PrepareStepContext) -> None:
        if context.step_index == 3:
            store.save(checkpoint([user("summary"), *context.messages[1:]], 2))

    result = await generate_text(model=counting(3), messages=[user("go")], tools={"count": COUNT}, store=store,
                                 run_id="r", prepare_step=summarise)
    saved = store.load("r")
    assert saved is not None and saved.step_index == 3 and list(saved.messages) == list(result.messages)
    assert store.load_step("r", 2) is None


@pytest.mark.requires_sqlite
async def test_a_runtime_keeps_the_runs_saved_under_a_lease_past_its_cache_until_the_lease_is_released(
        tmp_path: Path) -> None:
    """A runtime's cache keeps 256 runs it saved or loaded, and besides them every run saved under a session's lease
    until that lease is released. Seen as in the next test: a row changed behind the runtime's back survives a save
    its cache vouched for, and a save that read the rows back puts the saved message there again."""
    import sqlite3

    from durable_agent.backends import RunTransition
    from durable_agent.backends.sqlite import SqliteRuntime

    path = tmp_path / "rt.db"
    runtime = SqliteRuntime(path, synchronous="NORMAL")
    histories: dict[str, list[Message]] = {}

    def next_checkpoint(run_id: str) -> AgentCheckpoint:
        messages = histories.setdefault(run_id, [{"role": "user", "content": run_id}])
        messages = histories[run_id] = [*messages, {"role": "assistant", "content": str(len(messages))}]
        return AgentCheckpoint(run_id=run_id, step_index=len(messages), status="running", messages=messages,
                               usage=Usage(), created_at=0)

    async def save(run_id: str, epoch: int | None = None) -> None:
        if epoch is None:
            await runtime.stores.checkpoints.save(next_checkpoint(run_id))
        else:
            await runtime.commit(RunTransition("s", epoch, checkpoint=next_checkpoint(run_id)))

    async def churn() -> None:  # more other runs than the cache keeps
        for i in range(300):
            await save(f"other-{i}")

    def tamper(*run_ids: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.executemany("UPDATE durable_agent_messages SET body = ? WHERE run_id = ? AND seq = 0",
                             [('{"role":"user","content":"changed"}', run_id) for run_id in run_ids])

    def read_back(*run_ids: str) -> list[bool]:
        """Per run: whether its last save read the stored rows back."""
        with sqlite3.connect(path) as conn:
            return [conn.execute("SELECT body FROM durable_agent_messages WHERE run_id = ? AND seq = 0",
                                 (run_id,)).fetchone()[0].find("changed") < 0 for run_id in run_ids]

    try:
        epoch = (await runtime.lease.claim("s", stale_at=0)).epoch
        assert epoch is not None
        await save("held", epoch)
        await save("loaded")
        await churn()
        tamper("held", "loaded")
        await save("held", epoch)
        await save("loaded")
        assert read_back("held", "loaded") == [False, True]  # the held run was kept, the other evicted
        assert await runtime.stores.checkpoints.load("loaded") is not None  # a loaded run ...
        await save("loaded", epoch)  # ... saved under the lease is held now
        await save("held")  # a held run saved without the lease stays held
        await churn()
        tamper("held", "loaded")
        await save("held")
        await save("loaded")
        assert read_back("held", "loaded") == [False, False]
        await runtime.lease.release("s", epoch)
        tamper("held", "loaded")
        await save("held")
        await save("loaded")
        assert read_back("held", "loaded") == [True, True]  # released: both forgotten
    finally:
        runtime.close()


@pytest.mark.requires_sqlite
def test_a_store_keeps_running_runs_past_its_cache_capacity_until_a_save_ends_their_leg(tmp_path: Path) -> None:
    """What the store's cache vouches for is appended to without reading the stored rows; what it forgot is read
    back and compared. So a row changed behind the store's back (the header left alone) shows which: a save the
    cache vouched for leaves it, a save that read the rows back puts the saved message there again."""
    import sqlite3

    path = tmp_path / "h.db"
    store = SqliteCheckpointStore(str(path), cache_runs=2)
    histories: dict[str, list[Message]] = {}

    def save(run_id: str, status: Any) -> None:
        messages = histories.setdefault(run_id, [{"role": "user", "content": run_id}])
        messages = histories[run_id] = [*messages, {"role": "assistant", "content": str(len(messages))}]
        store.save(AgentCheckpoint(run_id=run_id, step_index=len(messages), status=status, messages=messages,
                                   usage=Usage(), created_at=0))

    def tamper(*run_ids: str) -> None:
        with sqlite3.connect(path) as conn:
            conn.executemany("UPDATE durable_agent_messages SET body = ? WHERE run_id = ? AND seq = 0",
                             [('{"role":"user","content":"changed"}', run_id) for run_id in run_ids])

    def read_back(*run_ids: str) -> list[bool]:
        """Per run: whether its last save read the stored rows back (a store of its own: this one's cache stays)."""
        reader = SqliteCheckpointStore(str(path))
        try:
            loaded = [reader.load(run_id) for run_id in run_ids]
            return [got is not None and got.messages[0]["content"] != "changed" for got in loaded]
        finally:
            reader.close()

    runs = [f"run-{i}" for i in range(5)]
    for run_id in runs:
        save(run_id, "running")
    tamper(*runs)
    for run_id in runs:
        save(run_id, "suspended")  # the leg ends
    assert read_back(*runs) == [False] * 5  # none was forgotten while running
    tamper(*runs)
    for run_id in ("run-4", "run-3", "run-0", "run-1", "run-2"):  # the two it kept first: the others evict them
        save(run_id, "suspended")
    assert read_back(*runs) == [True, True, True, False, False]  # past the leg, the LRU part (2) kept the latest
    abandoned = [f"abandoned-{i}" for i in range(64 * 2 + 1)]  # LIVE_PER_CAPACITY legs per run of capacity, and one
    for run_id in abandoned:
        save(run_id, "running")  # a leg no save ends
    tamper(*abandoned[:2])
    save(abandoned[1], "running")  # first: saving the evicted one evicts the next oldest
    save(abandoned[0], "running")
    assert read_back(*abandoned[:2]) == [True, False]  # the oldest went past the bound
    store.close()


@pytest.mark.requires_sqlite
def test_a_store_running_more_runs_than_its_cache_holds_never_reads_their_histories_back(tmp_path: Path) -> None:
    """The rows of a running run are re-read only when the cache cannot vouch for them; with more runs in flight
    than `cache_runs` an LRU evicted each before its next save, and every save read and re-encoded its history."""
    store = SqliteCheckpointStore(str(tmp_path / "h.db"), cache_runs=2)
    reads: list[str] = []
    store._runner._conn.set_trace_callback(lambda sql: reads.append(sql) if sql.startswith("SELECT") else None)
    histories: dict[str, list[Message]] = {f"r{i}": [{"role": "user", "content": f"go {i}"}] for i in range(6)}
    for step in range(3):
        for run_id, messages in list(histories.items()):  # interleaved, as concurrent runs save
            messages = histories[run_id] = [*messages, {"role": "assistant", "content": f"{run_id} {step}"}]
            store.save(AgentCheckpoint(run_id=run_id, step_index=step, status="running", messages=messages,
                                       usage=Usage(), created_at=0))
    # only each run's first save reads its head; later ones append, their header update checking the head itself
    assert len(reads) == len(histories) and all("FROM durable_agent_runs" in sql for sql in reads), reads
    for run_id, messages in histories.items():
        loaded = store.load(run_id)
        assert loaded is not None and list(loaded.messages) == messages


def test_a_stores_header_is_every_field_of_the_checkpoint_but_its_messages() -> None:
    """Built field by field: a field added to the checkpoint and left out of the header fails here."""
    import dataclasses

    from durable_agent import ToolApprovalRequest

    full = AgentCheckpoint(
        run_id="r", step_index=3, status="suspended", messages=[{"role": "user", "content": "a"}],
        usage=Usage(1, 2, 3, 4, 5, 6), created_at=7, agent_path=("outer",),
        pending_approvals=(ToolApprovalRequest("a1", "c1", "pay", {"x": 1}),),
        trace_context={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
    )
    header = full.to_dict(messages=False)
    assert set(header) == {f.name for f in dataclasses.fields(AgentCheckpoint)} - {"messages"}
    assert list(header.items()) == [(k, v) for k, v in full.to_dict().items() if k != "messages"]
    assert AgentCheckpoint.from_dict({**header, "messages": list(full.messages)}) == full


@pytest.mark.requires_sqlite
def test_revisions_draw_entropy_once_per_process_and_again_after_a_fork(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every save writes a fresh revision token into the run's header row (read back here from the file)."""
    import os
    import sqlite3
    import sys

    def revisions(path: Path) -> list[int]:
        with sqlite3.connect(path) as conn:
            return [row[0] for row in conn.execute("SELECT revision FROM durable_agent_runs ORDER BY run_id")]

    def save_a_run(path: Path) -> None:
        store = SqliteCheckpointStore(str(path))
        store.save(checkpoint([{"role": "user", "content": "hi"}], 0))
        store.close()

    draws: list[int] = []
    urandom = os.urandom

    def counted(n: int) -> bytes:
        draws.append(n)
        return urandom(n)

    monkeypatch.setattr(os, "urandom", counted)
    store = SqliteCheckpointStore(str(tmp_path / "many.db"))
    for i in range(200):
        store.save(AgentCheckpoint(run_id=f"r{i:04}", step_index=0, status="running", messages=[], usage=Usage(),
                                   created_at=0))
    store.close()
    tokens = revisions(tmp_path / "many.db")
    assert len(draws) <= 1 and len(set(tokens)) == 200 and all(0 < r < 2**63 for r in tokens)
    if sys.platform == "emscripten" or not hasattr(os, "fork"):
        return
    pid = os.fork()
    if pid == 0:  # the child saves a run of its own
        try:
            save_a_run(tmp_path / "child.db")
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    save_a_run(tmp_path / "parent.db")
    assert revisions(tmp_path / "child.db") != revisions(tmp_path / "parent.db")  # the same sequence in both would
    # make their tokens collide
