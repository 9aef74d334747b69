"""The append-only layout shared by the persistent stores.

A run is stored as a small *header* (the checkpoint without its messages, encoded by the
codec) plus one encoded row/entry per message, numbered from 0. A save writes only the
messages that are not stored yet, plus the header; loading rebuilds the checkpoint, decoding
the messages a batch at a time (`decode_batched`: one codec call per ~64K characters).

Finding "what is already stored" must not read, encode or write the history at every save,
or a 10,000-step run would get slower every step. Each store keeps, per run, the message
sequence of its last save (a reference, not a copy) and the *revision* (a random token the
header carries) that save wrote:

* if the stored revision still equals ours, nobody else wrote the run since, and the new
  history extends ours when its first `n` messages are our `n` messages. History is
  immutable by contract (messages are never mutated in place), so the check is an identity
  check of the boundary message plus the C-speed list comparison `new[:n] == cached`,
  which compares pointers only (about 0.1 ms for 20,000 messages on the benchmark
  machine: the one O(history) cost of a save, kept for exact rewrite detection); when
  they differ (a caller rebuilt the history), messages are compared by encoded form;
* otherwise (another process wrote, a restart, the cache evicted the run, a save whose
  outcome is unknown) the stored messages are read back and compared by encoded form:
  O(history) once, and the store heals, without a gap or a duplicate.

A rewritten prefix is therefore detected and the rows from the first differing message
on are replaced. Known limit, documented: a message replaced *in the middle* of a history
whose boundary message is still the same object, by a new message equal under Python
`==` but encoding differently (`1` vs `1.0` vs `True`), keeps its stored form.
"""

from __future__ import annotations

import os
import random
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .._checkpoint import AgentCheckpoint
from .._errors import CheckpointCorruptError, CheckpointVersionError, CodecError, ConfigurationError
from .._kernels import kernels
from .._messages import Message, built_from

_revisions: random.Random | None = None  # seeded from os.urandom at the first save, never at import


def _reseed_after_fork() -> None:
    global _revisions
    _revisions = None  # a forked child must not draw its parent's sequence


if hasattr(os, "register_at_fork"):  # not on WebAssembly, which cannot fork
    os.register_at_fork(after_in_child=_reseed_after_fork)


def new_revision() -> int:
    """A fresh revision token (random, 63 bits, never 0). Drawn at save time, never at import.

    One `os.urandom` call per process (and per fork) seeds a generator; a system call per save
    would cost more than the token is worth. The first draw is made inside a request, where
    Cloudflare Workers allow entropy.
    """
    global _revisions
    if _revisions is None:
        _revisions = random.Random(os.urandom(32))
    return _revisions.getrandbits(63) or 1


def encode_header(checkpoint: AgentCheckpoint) -> str:
    """The checkpoint without its messages, as codec text."""
    return kernels.encode(checkpoint.to_dict(messages=False))


def encode_messages(messages: Sequence[Message], start: int = 0) -> list[str]:
    """Codec text of `messages[start:]`, one string per message. Raises `CodecError`."""
    encode = kernels.encode
    return [encode(messages[i]) for i in range(start, len(messages))]


BATCH_CHARS = 1 << 16


def decode_batched(texts: Sequence[Any], decode_one: Callable[[int, Any], Any]) -> list[Any]:
    """The values of `texts` (codec texts, one value each), decoded a batch at a time.

    Runs of consecutive texts, about `BATCH_CHARS` characters each on average, are joined
    into the codec text of their list (``[`` + ``,``-joined + ``]``: what encoding that list
    writes, byte for byte) and decoded in one codec call. On the 10,000-step fixture of
    benches/bench_stores.py that costs about half of 20,000 separate decodes, and less than
    one decode of the whole history: a batch's text stays in the CPU cache, and the native
    decoder pauses the cyclic GC for texts of 8 KiB or more.

    A joined text gives one value per text only when every text is one value: one that is
    empty, holds two values or a torn one makes the batch invalid or its count differ. Then,
    and when a batch is refused for any other reason (a text that is not a `str`, or one
    nested exactly as deep as the codec allows, which is one level too deep inside the list),
    each text of the batch goes to `decode_one(index, text)`, which decodes it alone or
    raises naming the bad one: the same values and errors as decoding one by one. What a
    joined decode cannot tell from intact texts: damage to two neighbouring texts that moves
    the boundary between them and still leaves that many values (the callers' checks of
    every value still apply).
    """
    try:
        chars = sum(map(len, texts))
    except TypeError:  # an entry without a length is not text: decode_one names it
        chars = 0
    step = max(1, BATCH_CHARS * len(texts) // (chars or 1))
    values: list[Any] = []
    for start in range(0, len(texts), step):
        batch = texts[start : start + step]
        try:
            decoded = kernels.decode("[" + ",".join(batch) + "]")
        except (TypeError, CodecError):  # TypeError: an entry that is not a str
            decoded = None
        if type(decoded) is list and len(decoded) == len(batch):
            values += decoded
        else:
            values += [decode_one(start + i, text) for i, text in enumerate(batch)]
    return values


def decode_messages(bodies: Sequence[Any], run_id: str) -> list[Any]:
    """The messages stored as `bodies` (one codec text each); `CheckpointCorruptError` names a bad one."""
    return decode_batched(bodies, lambda seq, body: decode_message(body, run_id, seq))


def decode_message(text: Any, run_id: str, seq: int) -> Any:
    if not isinstance(text, str):
        raise CheckpointCorruptError(f"message {seq} is not text ({type(text).__name__})", run_id=run_id)
    try:
        return kernels.decode(text)
    except CodecError as exc:
        raise CheckpointCorruptError(f"message {seq} cannot be decoded: {exc}", run_id=run_id) from None


def rebuild(run_id: str, header: Any, bodies: Sequence[Any]) -> AgentCheckpoint:
    """The checkpoint stored as `header` (codec text) plus message `bodies` (codec texts).

    Raises `CheckpointCorruptError` naming `run_id` for anything inconsistent: an undecodable
    header or message, a header of another run, fields of the wrong type.
    A header written by a newer schema raises `CheckpointVersionError`.
    """
    return rebuild_decoded(run_id, decode_header(header, run_id), decode_messages(bodies, run_id))


def decode_header(text: Any, run_id: str) -> Any:
    """The header stored as `text` (codec text), decoded; `CheckpointCorruptError` when it is not."""
    if not isinstance(text, str):
        raise CheckpointCorruptError(f"header is not text ({type(text).__name__})", run_id=run_id)
    try:
        return kernels.decode(text)
    except CodecError as exc:
        raise CheckpointCorruptError(f"header cannot be decoded: {exc}", run_id=run_id) from None


def rebuild_decoded(run_id: str, header: Any, messages: list[Any]) -> AgentCheckpoint:
    """`rebuild` for a header and messages already decoded from codec text."""
    if not isinstance(header, dict):
        raise CheckpointCorruptError(f"header is not an object ({type(header).__name__})", run_id=run_id)
    if header.get("run_id") != run_id:
        raise CheckpointCorruptError(f"header names run {header.get('run_id')!r}", run_id=run_id)
    data = dict(header)
    data["messages"] = messages
    try:
        return AgentCheckpoint.from_dict(data, run_id=run_id)
    except (CheckpointVersionError, CheckpointCorruptError):
        raise
    except Exception as exc:  # noqa: BLE001 - any other failure of stored data is corruption
        raise CheckpointCorruptError(f"{type(exc).__name__}: {exc}", run_id=run_id) from None


LIVE_PER_CAPACITY = 64


@dataclass(frozen=True, slots=True)
class _Saved:
    revision: int
    messages: Sequence[Message]  # the caller's own sequence: history is immutable by contract
    count: int


Errors = type[BaseException] | tuple[type[BaseException], ...]


class _Forgetting:
    """`PrefixCache.forgetting`: a context manager, as a class (cheaper than a generator's, at every save)."""

    __slots__ = ("_cache", "_errors", "_run_id")

    def __init__(self, cache: PrefixCache, run_id: str, errors: Errors) -> None:
        self._cache, self._run_id, self._errors = cache, run_id, errors

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, traceback: object) -> None:
        if kind is not None and issubclass(kind, self._errors):
            self._cache.forget(self._run_id)


class PrefixCache:
    """Per run: the revision and message objects of this process's last save, in two parts.

    * Held runs: a run saved under a session's lease (`remember(..., holder=session_id)`) is
      kept until `release(session_id)`, however many runs are in flight, so a live run's save
      never misses (a miss re-reads and re-encodes its whole history). Their number is bounded
      by the sessions this process holds a lease on; the entries reference the histories
      those running runs hold anyway, they copy nothing.
    * Running runs: a store's save of a checkpoint whose status is ``running`` (`live=True`) is
      kept until a save of another status (the leg ended), however many runs are in flight: a
      server running more runs at once than `capacity` would otherwise miss on every save. Like
      held runs, they reference histories the running runs hold anyway. A run abandoned
      mid-leg leaves its entry; the oldest go beyond `LIVE_PER_CAPACITY` times `capacity`.
    * Others (loads, the saves that end a leg): a bounded LRU of `capacity` runs.

    It keeps a reference to the saved sequence, not a copy (a copy would cost O(history)
    per save), with its length at save time: a list appended to in place and saved again
    (against the contract) still gets its new messages stored. A message mutated in place
    cannot be seen; the contract forbids it (`durable_agent._messages`).
    """

    def __init__(self, capacity: int = 256) -> None:
        if type(capacity) is not int or capacity < 0:
            raise ConfigurationError(f"cache_runs must be a non-negative int, got {capacity!r}")
        self._capacity = capacity
        self._runs: OrderedDict[str, _Saved] = OrderedDict()
        self._live: dict[str, _Saved] = {}  # insertion order is save order: the first is the oldest
        self._held: dict[str, _Saved] = {}
        self._holders: dict[str, str] = {}  # held run -> the session holding it
        self._holding: dict[str, set[str]] = {}  # session -> its held runs

    def remember(
        self, run_id: str, revision: int, messages: Sequence[Message], holder: str | None = None, *, live: bool = False
    ) -> None:
        """Remember a save (or load) of `run_id`; `holder`: the session whose lease the save was made under;
        `live`: a store's save of a running checkpoint (see the class docs).

        A held run stays held (by its latest holder) until that session's `release`.
        """
        saved = _Saved(revision, messages, len(messages))
        if holder is None and run_id not in self._held:
            self._live.pop(run_id, None)  # re-inserted below: the latest save goes last
            if live:
                self._runs.pop(run_id, None)
                self._live[run_id] = saved
                if len(self._live) > LIVE_PER_CAPACITY * self._capacity:
                    del self._live[next(iter(self._live))]
                return
            self._runs[run_id] = saved
            self._runs.move_to_end(run_id)
            while len(self._runs) > self._capacity:
                self._runs.popitem(last=False)
            return
        self._runs.pop(run_id, None)
        self._live.pop(run_id, None)
        self._held[run_id] = saved
        if holder is not None and self._holders.get(run_id) != holder:
            self._unhold(run_id)
            self._holders[run_id] = holder
            self._holding.setdefault(holder, set()).add(run_id)

    def release(self, holder: str) -> None:
        """Forget the runs held by session `holder` (its lease was released): their runs are over here."""
        for run_id in self._holding.pop(holder, ()):
            del self._held[run_id], self._holders[run_id]

    def _unhold(self, run_id: str) -> None:
        holder = self._holders.pop(run_id, None)
        if holder is not None:
            runs = self._holding[holder]
            runs.discard(run_id)
            if not runs:
                del self._holding[holder]

    def remember_save(self, checkpoint: AgentCheckpoint, revision: int) -> None:
        """Remember a store's save of `checkpoint` at `revision`; a running one stays until its leg ends."""
        self.remember(checkpoint.run_id, revision, checkpoint.messages, live=checkpoint.status == "running")

    def forgetting(self, run_id: str, errors: Errors = BaseException) -> _Forgetting:
        """A ``with`` block that makes the cache forget `run_id` when it raises `errors`.

        The stores' rule for their cache: a save that failed (any error, a cancellation too: what it
        stored is unknown) or a load that found the run damaged (`CheckpointCorruptError`) leaves the
        stored data unknown, so the run's next save re-reads it instead of trusting this view.
        """
        return _Forgetting(self, run_id, errors)

    def forget(self, run_id: str) -> None:
        self._runs.pop(run_id, None)
        self._live.pop(run_id, None)
        if self._held.pop(run_id, None) is not None:
            self._unhold(run_id)

    def clear(self) -> None:
        self._runs.clear()
        self._live.clear()
        self._held.clear()
        self._holders.clear()
        self._holding.clear()

    def _saved(self, run_id: str) -> _Saved | None:
        saved = self._held.get(run_id) or self._live.get(run_id)
        return saved if saved is not None else self._runs.get(run_id)

    def revision(self, run_id: str) -> int | None:
        """The revision this process last wrote (or loaded) for `run_id`, if it still remembers it."""
        saved = self._saved(run_id)
        return None if saved is None else saved.revision

    def count(self, run_id: str) -> int | None:
        """How many messages the remembered save of `run_id` held, if it still remembers one."""
        saved = self._saved(run_id)
        return None if saved is None else saved.count

    def appended(self, run_id: str, new: Sequence[Message]) -> tuple[int, int] | None:
        """``(revision, count)`` of this process's last save of `run_id` when `new` only appends to that
        save's messages; None when the cache cannot vouch for it (nothing remembered, or a rewrite)."""
        saved = self._saved(run_id)
        if saved is None or self.kept(run_id, saved.revision, new) != saved.count:
            return None
        return saved.revision, saved.count

    def kept(self, run_id: str, stored_revision: int | None, new: Sequence[Message]) -> int | None:
        """How many leading messages of `new` are stored already, or None when this cache cannot tell.

        None means: read the stored messages and call `kept_by_encoding`.
        """
        if stored_revision is None:
            return 0
        saved = self._saved(run_id)
        if saved is None or saved.revision != stored_revision:
            return None
        old, n = saved.messages, saved.count
        if n == 0:
            return 0
        if built_from(new, old) and len(old) == n:
            return n  # the loop built `new` by appending to what was saved: O(1), no scan
        if len(new) >= n and new[n - 1] is old[n - 1]:
            head = new if len(new) == n else new[:n]
            if type(head) is type(old) and head == old:  # C speed; identical objects compare without work
                return n
        encode = kernels.encode
        limit = min(n, len(new))
        for i in range(limit):
            if new[i] is not old[i] and encode(new[i]) != encode(old[i]):
                return i
        return limit


def kept_by_encoding(stored: Sequence[str], new: Sequence[Message]) -> int:
    """Length of the common prefix of stored message texts and `new`, compared by encoded form."""
    encode = kernels.encode
    limit = min(len(stored), len(new))
    for i in range(limit):
        if stored[i] != encode(new[i]):
            return i
    return limit
