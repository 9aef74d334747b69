"""A reusable pytest conformance suite for `CheckpointStore` implementations.

Subclass `CheckpointStoreConformance` in a test module and give it a `make_store` fixture that
returns a zero-argument callable; each call must return a *new handle on the same storage*
(a fresh storage per test: a new file, a new key prefix, a new schema...). A store whose
handles cannot share storage may return the same instance every time::

    import pytest
    from durable_agent.testing import CheckpointStoreConformance

    class TestMyStore(CheckpointStoreConformance):
        @pytest.fixture
        def make_store(self, tmp_path):
            return lambda: MyStore(tmp_path / "runs.db")

Every store method may return its value or an awaitable (the `CheckpointStore` contract); the
suite drives awaitables on one event loop per test and closes each handle it opened
(calling `close()`, awaited when it returns an awaitable) before that loop ends.

The semantics checked, which every durable-agent backend implements:

* `save(checkpoint, *, expected_step_index=None)`: the latest save of a run wins; `load`
  returns a checkpoint equal to it (bytes, non-ASCII text, approvals, agent path included),
  whatever the history did between saves (grew, was rewritten, shrank). With
  `expected_step_index=n`, the save happens only if the stored checkpoint of that run is at
  step `n`; otherwise `CheckpointConflictError(run_id, expected=n, actual=<stored step or
  None>)` is raised and nothing is written. A checkpoint that cannot be encoded raises
  `CodecError` and the stored one stays.
* `load(run_id)`: None for a run never saved (or deleted).
* `delete(run_id)`: removes the run; deleting an unknown run is not an error.
* `list(*, status=None, limit=None, after=None)`: run ids in code-point order, only those
  whose latest status is `status` when given; `limit`/`after` page through them (keyset).
* `prune(*, before, status=None, include_suspended=False)`: deletes the runs whose latest
  checkpoint's `created_at` is before `before` (epoch ms), optionally only those with
  `status`, and returns their ids sorted. Suspended runs (awaiting a human) survive unless
  `include_suspended=True`; `status="suspended"` without it is a `ConfigurationError`.
* Bad arguments (not a checkpoint, an empty or NUL-containing run id, a negative limit)
  raise `ConfigurationError`.
* Fork and time travel (`durable_agent._fork`): `fork_run` at the latest step works on every
  store. A store with a step log (`load_step(run_id, step_index)`; set `keeps_step_log = False`
  on one without) returns the checkpoint saved at every boundary, drops the steps after a save
  at an earlier step and the steps whose messages a save rewrote, and never returns anything
  but what was saved at that step.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest

from .._checkpoint import AgentCheckpoint, RunStatus, ToolApprovalRequest, Usage
from .._errors import (
    CheckpointConflictError,
    CheckpointNotFoundError,
    CodecError,
    ConfigurationError,
    StepNotFoundError,
)
from .._fork import checkpoint_at_step, fork_run, update_run
from .._storage.validate import MAX_RUN_ID_BYTES


def message(i: int) -> Any:
    """The i-th message of a varied, deterministic conversation (text, tools, bytes, odd data)."""
    kind = i % 4
    if kind == 0:
        return {"role": "user", "content": f"question {i}: café ☕ — \U0001f600 «{i}»"}
    if kind == 1:
        return {
            "role": "assistant",
            "content": [
                {"type": "text", "text": f"calling a tool ({i})"},
                {
                    "type": "tool-call",
                    "tool_call_id": f"call-{i}",
                    "tool_name": "lookup",
                    "input": {"q": i, "ratio": i / 7, "big": 2**70 + i, "flags": [True, None]},
                },
            ],
        }
    if kind == 2:
        return {
            "role": "tool",
            "content": [
                {
                    "type": "tool-result",
                    "tool_call_id": f"call-{i - 1}",
                    "tool_name": "lookup",
                    "output": {"$bytes": "not really bytes", "n": i},
                    "is_error": False,
                }
            ],
        }
    return {
        "role": "user",
        "content": [
            {"type": "text", "text": "an image"},
            {"type": "image", "data": bytes(range(i % 256)) + b"\x00\xff", "media_type": "image/png"},
        ],
    }


def conversation(n: int) -> list[Any]:
    return [message(i) for i in range(n)]


def make_checkpoint(
    run_id: str = "run-1",
    step_index: int = 0,
    messages: Sequence[Any] | None = None,
    *,
    status: RunStatus = "running",
    created_at: int = 1_000,
    pending: bool = False,
    agent_path: tuple[str, ...] | None = None,
) -> AgentCheckpoint:
    """A valid checkpoint for tests; `pending=True` adds one approval request."""
    approvals = (
        (
            ToolApprovalRequest(
                approval_id=f"appr-{step_index}",
                tool_call_id="call-1",
                tool_name="pay",
                input={"amount": 12.5, "to": "Zoë"},
                agent_path=("outer", "inner"),
                token="tok.en",
            ),
        )
        if pending
        else None
    )
    return AgentCheckpoint(
        run_id=run_id,
        step_index=step_index,
        status=status,
        messages=conversation(2) if messages is None else messages,
        usage=Usage(10 * step_index, 3 * step_index, 13 * step_index),
        created_at=created_at,
        pending_approvals=approvals,
        agent_path=agent_path,
    )


class StoreCalls:
    """Calls store methods that may be sync or async, on one event loop, and closes what it opened."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._opened: list[Any] = []

    def __call__(self, value: Any) -> Any:
        if not inspect.isawaitable(value):
            return value
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(value)

    def open(self, factory: Callable[[], Any]) -> Any:
        store = self(factory())
        if all(store is not s for s in self._opened):
            self._opened.append(store)
        return store

    def close(self) -> None:
        try:
            for store in reversed(self._opened):
                close = getattr(store, "close", None)
                if close is not None:
                    self(close())
        finally:
            if self._loop is not None:
                self._loop.close()


class ForkConformance:
    """The fork and step-log cases of `CheckpointStoreConformance` (mixed into it)."""

    keeps_step_log: bool

    def _steps(self, store: Any, resolve: StoreCalls, run_id: str = "src") -> list[AgentCheckpoint]:
        """Five boundaries: growing history, one boundary with no new message, a suspension."""
        saved = []
        plan: list[tuple[int, RunStatus]] = [
            (2, "running"), (4, "running"), (4, "running"), (5, "suspended"), (7, "completed")
        ]
        for step, (count, status) in enumerate(plan):
            cp = make_checkpoint(run_id, step, conversation(count), status=status, created_at=100 + step,
                                 pending=status == "suspended")
            resolve(store.save(cp))
            saved.append(cp)
        return saved

    def _need_log(self) -> None:
        if not self.keeps_step_log:
            pytest.skip("this store keeps no step log")

    def test_fork_at_the_latest_step(self, store: Any, resolve: StoreCalls) -> None:
        saved = self._steps(store, resolve)
        forked = resolve(fork_run(store, "src", new_run_id="copy", clock=lambda: 5_000))
        assert forked.run_id == "copy" and forked.step_index == 4 and forked.created_at == 5_000
        assert resolve(store.load("copy")) == forked
        assert list(forked.messages) == list(saved[-1].messages) and forked.usage == saved[-1].usage
        assert resolve(store.load("src")) == saved[-1]  # the source is untouched

    def test_load_step_reads_every_boundary(self, store: Any, resolve: StoreCalls) -> None:
        self._need_log()
        saved = self._steps(store, resolve)
        for cp in saved:
            assert resolve(store.load_step("src", cp.step_index)) == cp
        assert resolve(store.load_step("src", 9)) is None
        assert resolve(store.load_step("nope", 0)) is None
        with pytest.raises(ConfigurationError):
            resolve(store.load_step("src", -1))

    def test_a_save_at_an_earlier_step_drops_the_later_ones(self, store: Any, resolve: StoreCalls) -> None:
        self._need_log()
        saved = self._steps(store, resolve)
        again = make_checkpoint("src", 2, [*conversation(4), message(50)], created_at=900)
        resolve(store.save(again))
        assert [resolve(store.load_step("src", i)) for i in range(5)] == [saved[0], saved[1], again, None, None]

    def test_long_histories_saved_and_appended_in_one_save_round_trip(self, store: Any, resolve: StoreCalls) -> None:
        """Hundreds of messages in one save (a SQL store writes them in chunks of rows), then more."""
        self._need_log()
        first = make_checkpoint("long", 0, conversation(600))
        resolve(store.save(first))
        longer = make_checkpoint("long", 1, conversation(1_100))
        resolve(store.save(longer))
        assert resolve(store.load("long")) == longer and resolve(store.load_step("long", 0)) == first

    def test_a_rewritten_history_drops_the_steps_it_replaced(self, store: Any, resolve: StoreCalls) -> None:
        self._need_log()
        saved = self._steps(store, resolve)
        history = conversation(7)
        rewritten = make_checkpoint("src", 5, [*history[:3], {"role": "user", "content": "edited"}, *history[4:]])
        resolve(store.save(rewritten))
        found = [resolve(store.load_step("src", i)) for i in range(6)]
        assert found == [saved[0], None, None, None, None, rewritten]

    def test_delete_and_prune_drop_the_step_log(self, store: Any, resolve: StoreCalls) -> None:
        self._need_log()
        self._steps(store, resolve)
        resolve(store.delete("src"))
        resolve(store.save(make_checkpoint("src", 0, conversation(1))))
        assert resolve(store.load_step("src", 1)) is None
        self._steps(store, resolve, "old")
        assert resolve(store.prune(before=10_000)) == ["old", "src"]
        assert resolve(store.load_step("old", 1)) is None

    def test_fork_at_an_earlier_step_then_the_runs_diverge(self, store: Any, resolve: StoreCalls) -> None:
        saved = self._steps(store, resolve)
        if not self.keeps_step_log:
            with pytest.raises(StepNotFoundError):
                resolve(fork_run(store, "src", new_run_id="b", at_step=1))
            return
        forked = resolve(fork_run(store, "src", new_run_id="b", at_step=1, clock=lambda: 7))
        assert list(forked.messages) == list(saved[1].messages)
        assert (forked.step_index, forked.usage, forked.status) == (1, saved[1].usage, "running")
        grown = make_checkpoint("b", 2, [*forked.messages, message(90)])
        resolve(store.save(grown))
        assert resolve(store.load("b")) == grown
        assert resolve(store.load("src")) == saved[-1]
        assert resolve(store.load_step("src", 3)) == saved[3]
        assert resolve(checkpoint_at_step(store, "b", 1)) == forked

    def test_fork_at_a_suspended_step_keeps_its_approvals(self, store: Any, resolve: StoreCalls) -> None:
        self._need_log()
        self._steps(store, resolve)
        # step 3 is suspended on one approval whose call is the assistant message's tool call
        src = resolve(checkpoint_at_step(store, "src", 3))
        assert src.status == "suspended" and src.pending_approvals

        def mark(history: list[Any]) -> list[Any]:  # make the request's call open and marked
            call = {"type": "tool-call", "tool_call_id": "call-1", "tool_name": "pay", "input": {}}
            marker = {"type": "tool-approval-request", "approval_id": "appr-3", "tool_call_id": "call-1"}
            return [*history, {"role": "assistant", "content": [call, marker]}]

        forked = resolve(fork_run(store, "src", new_run_id="f", at_step=3, edit=mark, generate_id=lambda: "appr-f"))
        assert forked.status == "suspended"
        assert [r.approval_id for r in forked.pending_approvals or ()] == ["appr-f"]  # no two runs share an id
        assert forked.messages[-1]["content"][1]["approval_id"] == "appr-f"  # its marker too
        assert forked.pending_approvals[0].token is None  # bound to the first run: dropped
        assert resolve(store.load("f")) == forked
        unmarked = resolve(fork_run(store, "src", new_run_id="g", at_step=3))
        assert unmarked.status == "running" and unmarked.pending_approvals is None

    def test_fork_refuses_bad_targets_and_steps(self, store: Any, resolve: StoreCalls) -> None:
        self._steps(store, resolve)
        resolve(store.save(make_checkpoint("taken", 0)))
        with pytest.raises(CheckpointConflictError):
            resolve(fork_run(store, "src", new_run_id="taken"))
        with pytest.raises(CheckpointNotFoundError):
            resolve(fork_run(store, "missing", new_run_id="x"))
        with pytest.raises(StepNotFoundError):
            resolve(fork_run(store, "src", new_run_id="x", at_step=5))
        with pytest.raises(ConfigurationError):
            resolve(fork_run(store, "src", new_run_id="src"))
        with pytest.raises(ConfigurationError):
            bad: Any = {"role": "robot", "content": ""}
            resolve(fork_run(store, "src", new_run_id="x", edit=lambda h: [*h, bad]))
        assert resolve(store.load("x")) is None

    def test_update_run_edits_in_place_and_is_fenced(self, store: Any, resolve: StoreCalls) -> None:
        saved = self._steps(store, resolve)
        updated = resolve(update_run(store, "src", lambda h: [*h[:-1], {"role": "user", "content": "instead"}]))
        assert resolve(store.load("src")) == updated and updated.step_index == saved[-1].step_index
        assert updated.messages[-1] == {"role": "user", "content": "instead"}
        if self.keeps_step_log:
            assert resolve(store.load_step("src", 4)) == updated
            assert resolve(store.load_step("src", 0)) == saved[0]


class CheckpointStoreConformance(ForkConformance):
    """The suite. Subclass it and define the `make_store` fixture (see the module docstring).

    Set `checks_encoding = False` on a store that keeps checkpoints as objects and never
    encodes them (the in-memory reference store): the encoding test is then skipped.
    """

    checks_encoding: bool = True
    keeps_step_log: bool = True

    @pytest.fixture
    def make_store(self) -> Callable[[], Any]:
        raise NotImplementedError("define a `make_store` fixture returning a store factory")

    @pytest.fixture
    def resolve(self) -> Iterator[StoreCalls]:
        resolve = StoreCalls()
        yield resolve
        resolve.close()

    @pytest.fixture
    def store(self, make_store: Callable[[], Any], resolve: StoreCalls) -> Any:
        return resolve.open(make_store)

    # -- save / load -------------------------------------------------------------------

    def test_load_of_unknown_run_is_none(self, store: Any, resolve: StoreCalls) -> None:
        assert resolve(store.load("never-saved")) is None

    def test_round_trip_keeps_every_field(self, store: Any, resolve: StoreCalls) -> None:
        cp = make_checkpoint(
            "run-é/1",
            7,
            conversation(9),
            status="suspended",
            created_at=1_234_567,
            pending=True,
            agent_path=("outer", "sub"),
        )
        cp = dataclasses.replace(cp, trace_context={
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "tracestate": "k=v"})
        resolve(store.save(cp))
        loaded = resolve(store.load("run-é/1"))
        assert loaded == cp
        assert isinstance(loaded.messages[3]["content"][1]["data"], bytes)
        assert loaded.messages[2]["content"][0]["output"] == {"$bytes": "not really bytes", "n": 2}

    def test_latest_save_wins_as_history_grows(self, store: Any, resolve: StoreCalls) -> None:
        history: list[Any] = []
        for step in range(40):
            history = [*history, message(2 * step), message(2 * step + 1)]
            cp = make_checkpoint("grow", step, history, created_at=1_000 + step)
            resolve(store.save(cp))
            if step % 13 == 0:
                assert resolve(store.load("grow")) == cp
        assert resolve(store.load("grow")) == cp
        assert len(resolve(store.load("grow")).messages) == 80

    def test_status_and_step_changes_without_new_messages(self, store: Any, resolve: StoreCalls) -> None:
        history = conversation(4)
        resolve(store.save(make_checkpoint("same", 1, history)))
        final = make_checkpoint("same", 2, history, status="completed", created_at=5_000)
        resolve(store.save(final))
        assert resolve(store.load("same")) == final

    @pytest.mark.parametrize(
        "rewrite",
        [
            pytest.param(
                lambda h: [*h[:3], {"role": "user", "content": "edited"}, *h[4:], message(99)], id="middle"
            ),
            pytest.param(lambda h: h[:3], id="truncated"),
            pytest.param(lambda h: [], id="emptied"),
            pytest.param(lambda h: [{"role": "system", "content": "summary"}, *h[-2:]], id="compacted"),
            pytest.param(lambda h: [*copy.deepcopy(h), message(50)], id="deep-copied"),
            pytest.param(lambda h: [*h[:-1], {**h[-1], "content": "changed last"}], id="last-replaced"),
        ],
    )
    def test_rewritten_history_is_stored_as_given(
        self, store: Any, resolve: StoreCalls, rewrite: Callable[[list[Any]], list[Any]]
    ) -> None:
        history = conversation(8)
        resolve(store.save(make_checkpoint("rw", 1, history)))
        rewritten = make_checkpoint("rw", 2, rewrite(history))
        resolve(store.save(rewritten))
        assert resolve(store.load("rw")) == rewritten
        grown = make_checkpoint("rw", 3, [*rewritten.messages, message(70)])
        resolve(store.save(grown))
        assert resolve(store.load("rw")) == grown

    def test_middle_message_replaced_while_tail_is_kept(self, store: Any, resolve: StoreCalls) -> None:
        history = conversation(10)
        resolve(store.save(make_checkpoint("mid", 1, history)))
        rewritten = [*history[:2], {"role": "user", "content": "redacted"}, *history[3:]]
        assert rewritten[-1] is history[-1]
        cp = make_checkpoint("mid", 2, rewritten)
        resolve(store.save(cp))
        assert resolve(store.load("mid")) == cp

    def test_a_list_grown_in_place_between_saves(self, store: Any, resolve: StoreCalls) -> None:
        """Against the immutability contract, but it must not lose messages."""
        history = conversation(3)
        resolve(store.save(make_checkpoint("inplace", 1, history)))
        history.append(message(3))
        resolve(store.save(make_checkpoint("inplace", 2, history)))
        assert resolve(store.load("inplace")) == make_checkpoint("inplace", 2, conversation(4))

    def test_handles_share_runs_and_heal_stale_views(
        self, make_store: Callable[[], Any], resolve: StoreCalls
    ) -> None:
        first, second = resolve.open(make_store), resolve.open(make_store)
        history = conversation(6)
        resolve(first.save(make_checkpoint("shared", 1, history)))
        resumed = resolve(second.load("shared"))
        assert resumed == make_checkpoint("shared", 1, history)
        by_second = make_checkpoint("shared", 2, [*resumed.messages, message(40), message(41)])
        resolve(second.save(by_second))
        assert resolve(first.load("shared")) == by_second
        # `first` now writes from its own older view: latest save wins, nothing duplicated or lost.
        by_first = make_checkpoint("shared", 3, [*history, message(60)])
        resolve(first.save(by_first))
        assert resolve(second.load("shared")) == by_first
        again = make_checkpoint("shared", 4, [*by_first.messages, message(61)])
        resolve(second.save(again))
        assert resolve(first.load("shared")) == again

    def test_stale_handle_after_another_shortened_the_run(
        self, make_store: Callable[[], Any], resolve: StoreCalls
    ) -> None:
        mine, theirs = resolve.open(make_store), resolve.open(make_store)
        history = conversation(6)
        resolve(mine.save(make_checkpoint("short", 1, history)))
        resolve(theirs.save(make_checkpoint("short", 2, history[:2])))
        extended = make_checkpoint("short", 3, [*history, message(6)])
        resolve(mine.save(extended))  # from a view that is stale: the store must not trust it
        assert resolve(theirs.load("short")) == extended
        assert resolve(mine.load("short")) == extended

    def test_runs_are_isolated(self, store: Any, resolve: StoreCalls) -> None:
        saved: dict[str, AgentCheckpoint] = {}
        for step in range(5):
            for run_id in ("a", "ab", "b"):
                n = len(run_id) * 2 + step
                saved[run_id] = make_checkpoint(run_id, step, conversation(n))
                resolve(store.save(saved[run_id]))
        resolve(store.delete("ab"))
        assert resolve(store.load("a")) == saved["a"]
        assert resolve(store.load("b")) == saved["b"]
        assert resolve(store.load("ab")) is None

    @pytest.mark.parametrize(
        "run_id",
        ["a/b\\c", "ü 'x' \"y\"", "line\nbreak\ttab", "%s ? ; DROP TABLE x; --", "\U0001f600" * 40, "*"],
    )
    def test_unusual_run_ids(self, store: Any, resolve: StoreCalls, run_id: str) -> None:
        cp = make_checkpoint(run_id, 3, conversation(5))
        resolve(store.save(cp))
        assert resolve(store.load(run_id)) == cp
        assert resolve(store.list()) == [run_id]
        resolve(store.delete(run_id))
        assert resolve(store.load(run_id)) is None

    def test_unencodable_checkpoint_raises_codec_error_and_keeps_the_stored_one(
        self, store: Any, resolve: StoreCalls
    ) -> None:
        if not self.checks_encoding:
            pytest.skip("this store keeps checkpoints as objects and never encodes them")
        good = make_checkpoint("enc", 1, conversation(3))
        resolve(store.save(good))
        bad = make_checkpoint(
            "enc", 2, [*good.messages, {"role": "user", "content": [{"type": "x", "v": {1, 2}}]}]
        )
        with pytest.raises(CodecError):
            resolve(store.save(bad))
        assert resolve(store.load("enc")) == good
        nan = make_checkpoint("enc", 2, [*good.messages, {"role": "user", "content": [{"v": float("nan")}]}])
        with pytest.raises(CodecError):
            resolve(store.save(nan))
        better = make_checkpoint("enc", 3, [*good.messages, message(3)])
        resolve(store.save(better))
        assert resolve(store.load("enc")) == better

    # -- optimistic guard --------------------------------------------------------------

    def test_expected_step_index_guards_against_another_writer(self, store: Any, resolve: StoreCalls) -> None:
        resolve(store.save(make_checkpoint("g", 4, conversation(4)), expected_step_index=None))
        resolve(store.save(make_checkpoint("g", 5, conversation(5)), expected_step_index=4))
        with pytest.raises(CheckpointConflictError) as caught:
            resolve(store.save(make_checkpoint("g", 6, conversation(7)), expected_step_index=4))
        assert (caught.value.run_id, caught.value.expected, caught.value.actual) == ("g", 4, 5)
        assert caught.value.code == "checkpoint_conflict"
        assert resolve(store.load("g")) == make_checkpoint("g", 5, conversation(5))
        resolve(store.save(make_checkpoint("g", 6, conversation(6)), expected_step_index=5))
        assert resolve(store.load("g")).step_index == 6

    def test_expected_step_index_on_a_missing_run_conflicts(self, store: Any, resolve: StoreCalls) -> None:
        with pytest.raises(CheckpointConflictError) as caught:
            resolve(store.save(make_checkpoint("new", 1), expected_step_index=0))
        assert caught.value.actual is None
        assert resolve(store.load("new")) is None

    # -- delete / list / prune ---------------------------------------------------------

    def test_delete(self, store: Any, resolve: StoreCalls) -> None:
        resolve(store.save(make_checkpoint("d", 2, conversation(6))))
        resolve(store.delete("d"))
        assert resolve(store.load("d")) is None
        assert resolve(store.list()) == []
        resolve(store.delete("d"))
        resolve(store.delete("never-saved"))
        again = make_checkpoint("d", 0, conversation(2))
        resolve(store.save(again))
        assert resolve(store.load("d")) == again

    def _populate(self, store: Any, resolve: StoreCalls) -> None:
        statuses: list[RunStatus] = ["running", "suspended", "completed"]
        for i in range(12):
            status = statuses[i % 3]
            cp = make_checkpoint(
                f"run-{i:02d}",
                i,
                conversation(2),
                status=status,
                created_at=1_000 * (i + 1),
                pending=status == "suspended",
            )
            resolve(store.save(cp))

    def test_list_is_sorted_and_filtered_by_latest_status(self, store: Any, resolve: StoreCalls) -> None:
        assert resolve(store.list()) == []
        self._populate(store, resolve)
        assert resolve(store.list()) == [f"run-{i:02d}" for i in range(12)]
        assert resolve(store.list(status="suspended")) == [f"run-{i:02d}" for i in range(1, 12, 3)]
        resolve(store.save(make_checkpoint("run-01", 20, conversation(3), status="completed")))
        assert "run-01" not in resolve(store.list(status="suspended"))
        assert "run-01" in resolve(store.list(status="completed"))

    def test_list_pages_cover_every_run_once(self, store: Any, resolve: StoreCalls) -> None:
        self._populate(store, resolve)
        seen: list[str] = []
        after = None
        while True:
            page = resolve(store.list(limit=5, after=after))
            assert len(page) <= 5
            if not page:
                break
            seen.extend(page)
            after = page[-1]
        assert seen == resolve(store.list())
        assert resolve(store.list(status="running", limit=2, after="run-00")) == ["run-03", "run-06"]

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"limit": 0},
            {"limit": -1},
            {"limit": "5"},
            {"status": "done"},
            {"after": 3},
            {"after": "lone\ud800"},
            {"after": "nul\x00"},
            {"after": "x" * (MAX_RUN_ID_BYTES + 1)},
        ],
    )
    def test_list_rejects_bad_arguments(
        self, store: Any, resolve: StoreCalls, kwargs: dict[str, Any]
    ) -> None:
        with pytest.raises(ConfigurationError):
            resolve(store.list(**kwargs))

    def test_prune_keeps_suspended_runs_unless_asked(self, store: Any, resolve: StoreCalls) -> None:
        self._populate(
            store, resolve
        )  # run-i created at 1000*(i+1); statuses cycle running/suspended/completed
        deleted = resolve(store.prune(before=6_500))
        assert deleted == ["run-00", "run-02", "run-03", "run-05"]
        assert resolve(store.list()) == ["run-01", "run-04", *[f"run-{i:02d}" for i in range(6, 12)]]
        assert resolve(store.load("run-01")).status == "suspended"
        assert resolve(store.prune(before=6_500)) == []
        assert resolve(store.prune(before=12_500, status="completed")) == ["run-08", "run-11"]
        assert resolve(store.prune(before=12_500, include_suspended=True)) == [
            "run-01",
            "run-04",
            "run-06",
            "run-07",
            "run-09",
            "run-10",
        ]
        assert resolve(store.list()) == []

    def test_prune_of_suspended_runs_must_be_explicit(self, store: Any, resolve: StoreCalls) -> None:
        self._populate(store, resolve)
        with pytest.raises(ConfigurationError):
            resolve(store.prune(before=99_000, status="suspended"))
        assert resolve(store.prune(before=99_000, status="suspended", include_suspended=True)) == [
            f"run-{i:02d}" for i in range(1, 12, 3)
        ]
        assert resolve(store.list(status="suspended")) == []
        with pytest.raises(ConfigurationError):
            resolve(store.prune(before="yesterday"))

    # -- bad input ---------------------------------------------------------------------

    @pytest.mark.parametrize(
        "bad",
        [
            pytest.param(lambda: {"run_id": "x"}, id="dict"),
            pytest.param(lambda: make_checkpoint(""), id="empty-run-id"),
            pytest.param(lambda: make_checkpoint("nul\x00id"), id="nul-run-id"),
            pytest.param(lambda: make_checkpoint("lone\ud800"), id="surrogate-run-id"),
        ],
    )
    def test_save_rejects_bad_input(self, store: Any, resolve: StoreCalls, bad: Callable[[], Any]) -> None:
        with pytest.raises(ConfigurationError):
            resolve(store.save(bad()))
        assert resolve(store.list()) == []

    def test_bad_expected_step_index_and_run_ids_are_rejected(self, store: Any, resolve: StoreCalls) -> None:
        for expected in (-1, "3", 1.0, True):
            with pytest.raises(ConfigurationError):
                resolve(store.save(make_checkpoint("x", 1), expected_step_index=expected))
        for run_id in ("", None, 3, "a\x00b"):
            with pytest.raises(ConfigurationError):
                resolve(store.load(run_id))
            with pytest.raises(ConfigurationError):
                resolve(store.delete(run_id))
        assert resolve(store.list()) == []

    def test_one_run_id_length_rule_for_every_backend(self, store: Any, resolve: StoreCalls) -> None:
        longest = "é" * (MAX_RUN_ID_BYTES // 2)  # MAX_RUN_ID_BYTES bytes in UTF-8
        cp = make_checkpoint(longest, 1, conversation(2))
        resolve(store.save(cp))
        assert resolve(store.load(longest)) == cp
        assert resolve(store.list(after="é")) == [longest]
        too_long = longest + "x"
        with pytest.raises(ConfigurationError, match=str(MAX_RUN_ID_BYTES)):
            resolve(store.save(make_checkpoint(too_long, 1)))
        for method in (store.load, store.delete):
            with pytest.raises(ConfigurationError):
                resolve(method(too_long))
        assert resolve(store.list()) == [longest]


def hammer_one_run(stores: Sequence[Any], steps: int = 15, run_id: str = "hot") -> AgentCheckpoint:
    """Several threads, one per (synchronous) store handle, save one run concurrently.

    Each writer saves histories of varying length (growing and shrinking). Returns the
    checkpoint loaded afterwards, after checking that no writer failed and that the stored
    history is one a writer saved (a prefix of `conversation(...)`: no gap, no duplicate).
    """
    import threading

    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            for step in range(steps):
                stores[i].save(make_checkpoint(run_id, step, conversation((step * (i + 1)) % 9 + 1)))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    loaded: AgentCheckpoint | None = stores[0].load(run_id)
    assert loaded is not None and loaded.step_index == steps - 1
    assert loaded.messages == conversation(len(loaded.messages))
    return loaded
