"""`DurableObjectCheckpointStore`: checkpoints in a Cloudflare Durable Object's own storage, append-only;
`AsyncDurableObjectCheckpointStore`: the same store with coroutine methods, for WebCrypto.

It uses the synchronous key-value API of a SQLite-backed Durable Object (`ctx.storage.kv`:
``get(key)``, ``put(key, value)``, ``delete(key)``, ``list(prefix=, start=, ...)``), which is
what a Durable Object created with ``new_sqlite_classes`` (the default for new classes) has,
and runs each save and delete in ``ctx.storage.transactionSync`` when the storage has it, so a
save is applied whole or not at all.

Two faces, one logic (`durable_agent._storage.faces`), the same entries: they read and write each
other's runs. They differ in how rows are sealed with ``encryption=keyring``:

* `DurableObjectCheckpointStore` (synchronous) seals with the keyring's `seal`/`open`, which need
  the `cryptography` package. Nothing it does awaits, so no other request runs between its reads
  and its writes (a Durable Object delivers the next event only when this one yields).
* `AsyncDurableObjectCheckpointStore` (``await store.save(...)``) seals with `seal_async`/`open_async`:
  WebCrypto (``crypto.subtle``) in a Worker that has no `cryptography`. While it awaits a WebCrypto
  promise, another request to the object may run (input gates hold events back only during storage
  operations) and save the same run. So a save reads the run's index entry, applies the
  `expected_step_index` guard, finds which messages are stored already (opening them if its cache
  cannot tell), and seals the header and the new messages; then one `transactionSync` re-reads the
  index entry and writes the rows only if it is the one read (every save writes a fresh revision),
  else the save starts over from what is stored now, guard included. A load reads the index entry
  and every entry of the run in one go, then opens them; a rekey writes a run only if it still
  holds exactly what was read (else the run is counted `changed`).

The limit that shapes the layout: on a SQLite-backed object, one entry's key and value
together hold at most 2 MB (`MAX_ENTRY_BYTES`, Cloudflare's documented limit). So a run is
not one value: like the other stores (`durable_agent._storage.history`), it is a small index
entry plus one entry per message, and a save writes only the messages not stored yet plus the
header. A message or header too large for one entry is split into parts. Keys, under `prefix`:

* ``{prefix}run:{run_id}`` — JSON ``{"s": status, "i": step_index, "t": created_at,
  "n": message count, "v": revision, "h": header parts}``; `list`/`prune` read only these;
* ``{prefix}data:{len(run_id)}:{run_id}:h0000000000.{part:04d}/{parts:04d}`` — the header
  (the checkpoint without its messages, codec text), and
  ``...:m{seq:010d}.{part:04d}/{parts:04d}`` — message `seq` (codec text, bytes survive as
  ``$bytes``). Each part holds at most `MAX_ENTRY_BYTES` minus its key minus a 1 KiB margin for
  the storage's own encoding, counted in UTF-8 (never less than what the storage counts).
* ``{prefix}step:{len(run_id)}:{run_id}:{step_index:012d}`` — the step log (`load_step`, for
  `durable_agent._fork`): JSON ``{"n": message count, "h": header}`` of the save at that step,
  under the rules of `durable_agent._storage.step_log`. A header too large for one entry is not
  logged (that step cannot be read back; the latest step always can).

Damage stays the damaged run's problem: loading it raises `CheckpointCorruptError` naming it
(an unreadable index entry, missing or extra parts, undecodable text), its next save replaces
it, and `list`/`prune` skip and log an unreadable index entry.

Pure Python (standard library and this package only), no import of the Workers runtime:
`storage` is anything shaped like `DurableObjectStorage` (the real one through Pyodide's JS
bridge, or a test double).
"""

from __future__ import annotations

import builtins
import json
import re
from abc import abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any, TypeVar

from .._checkpoint import AgentCheckpoint, RunStatus
from .._errors import CheckpointCorruptError, ConfigurationError
from .._messages import Message
from .._storage.faces import AsyncFace, StoreLogic, SyncFace
from .._storage.history import PrefixCache, kept_by_encoding, new_revision
from .._storage.indexed import guard, listing, pruning
from .._storage.sealing import DAMAGE, HEADER, MESSAGE, row_sealer
from .._storage.validate import logger
from ..encryption import Keyring, Place
from ..encryption._rekey import Rekeyer, RekeyReport

MAX_ENTRY_BYTES = 2 * 1024 * 1024
"""SQLite-backed Durable Objects: "Key and value combined cannot exceed 2 MB"."""

_MARGIN = 1024  # bytes left per entry for the storage's own encoding of a string
_MAX_PREFIX_BYTES = 256
_PART = re.compile(r"([hm])([0-9]{10})\.([0-9]{4})/([0-9]{4})")
_T = TypeVar("_T")
Writes = list[tuple[int, Any]]  # a rekey's rewrites: (position among the run's rows, new value)
_StoredRows = tuple[str, list[str], list[tuple[str, tuple[int, str] | None]]]  # header, messages, step log


@dataclass(frozen=True, slots=True)
class _Index:
    """A run's index entry."""

    status: str
    step_index: int
    created_at: int
    count: int
    revision: int
    header_parts: int

    def dumps(self) -> str:
        return json.dumps(
            {
                "s": self.status,
                "i": self.step_index,
                "t": self.created_at,
                "n": self.count,
                "v": self.revision,
                "h": self.header_parts,
            },
            separators=(",", ":"),
        )

    @classmethod
    def parse(cls, value: Any) -> _Index | None:
        """The index entry stored as `value`, or None when it is damaged."""
        try:
            data = json.loads(value)
            fields = (data["s"], data["i"], data["t"], data["n"], data["v"], data["h"])
        except (ValueError, TypeError, KeyError):
            return None
        status, *numbers = fields
        if not isinstance(status, str) or any(type(n) is not int for n in numbers):
            return None
        index = cls(status, *numbers)
        return index if index.count >= 0 and index.header_parts >= 1 else None


def _split_utf8(text: str, limit: int) -> list[str]:
    """`text` cut into pieces of at most `limit` UTF-8 bytes each, never inside a character."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return [text]
    pieces = []
    start = 0
    while start < len(data):
        end = min(start + limit, len(data))
        while end < len(data) and data[end] & 0xC0 == 0x80:  # a continuation byte: back off
            end -= 1
        pieces.append(data[start:end].decode("utf-8"))
        start = end
    return pieces


def _step_entry(value: Any) -> tuple[int, str] | None:
    """``(message count, header)`` of a step log entry, or None when it is damaged."""
    try:
        data = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(data, dict) or type(data.get("n")) is not int or not isinstance(data.get("h"), str):
        return None
    return data["n"], data["h"]


def _part_key(base: str, tag: str, index: int, part: int, parts: int) -> str:
    return f"{base}{tag}{index:010d}.{part:04d}/{parts:04d}"


class _DurableObjectStore(StoreLogic):
    """The Durable Object store's logic, written once for its two faces (see the module docs).

    Its storage I/O is synchronous (`ctx.storage.kv`); what a face supplies is how rows are sealed and
    opened: at once (`DurableObjectCheckpointStore`: the keyring's `seal`/`open`) or awaited
    (`AsyncDurableObjectCheckpointStore`: `seal_async`/`open_async`, WebCrypto in a Worker).
    """

    def __init__(
        self,
        storage: Any,
        *,
        prefix: str = "checkpoint:",
        max_entry_bytes: int = MAX_ENTRY_BYTES,
        cache_runs: int = 256,
        encryption: Keyring | None = None,
    ) -> None:
        kv = getattr(storage, "kv", None)
        if kv is None:
            raise ConfigurationError(
                f"{type(self).__name__} needs ctx.storage of a SQLite-backed Durable Object (it uses "
                "ctx.storage.kv); declare the class under new_sqlite_classes in the migrations of wrangler.toml"
            )
        if not isinstance(prefix, str) or not prefix or len(prefix.encode("utf-8", "replace")) > _MAX_PREFIX_BYTES:
            raise ConfigurationError(f"prefix must be a non-empty str of at most {_MAX_PREFIX_BYTES} bytes, got {prefix!r}")
        if type(max_entry_bytes) is not int or max_entry_bytes < 8 * 1024:
            raise ConfigurationError(f"max_entry_bytes must be an int >= 8192, got {max_entry_bytes!r}")
        self._kv = kv
        self._transaction = getattr(storage, "transactionSync", None)
        self._prefix = prefix
        self._max = max_entry_bytes
        self._cache = PrefixCache(cache_runs)
        self._sealer = row_sealer(encryption)

    # -- what a face supplies: sealing and opening rows ------------------------------------------

    @abstractmethod
    async def _header_row(self, checkpoint: AgentCheckpoint) -> str: ...

    @abstractmethod
    async def _message_rows(self, run_id: str, messages: Sequence[Message], start: int) -> builtins.list[str]: ...

    @abstractmethod
    async def _rebuild(self, run_id: str, step_index: int, header: str, bodies: Sequence[str]) -> AgentCheckpoint: ...

    @abstractmethod
    async def _comparable(self, run_id: str, bodies: Sequence[str]) -> Sequence[Any]: ...

    @abstractmethod
    async def _rekeyed(self, rekeyer: Rekeyer, rows: Sequence[tuple[Any, Place]]) -> tuple[RekeyReport, Writes]: ...

    # -- keys and entries ------------------------------------------------------------------

    def _run_key(self, run_id: str) -> str:
        return f"{self._prefix}run:{run_id}"

    def _data_prefix(self, run_id: str) -> str:
        return f"{self._prefix}data:{len(run_id)}:{run_id}:"

    def _atomic(self, work: Callable[[], _T]) -> _T:
        """`work()` in one storage transaction when the storage offers `transactionSync`."""
        if self._transaction is None:
            return work()
        box: list[_T] = []
        self._transaction(lambda: box.append(work()))
        return box[0]

    def _parts(self, base: str, tag: str, index: int, text: str) -> builtins.list[tuple[str, str]]:
        """The (key, value) entries storing one header or message, split to fit the entry limit."""
        key_bytes = len(_part_key(base, tag, index, 0, 1).encode("utf-8"))
        pieces = _split_utf8(text, self._max - key_bytes - _MARGIN)
        return [(_part_key(base, tag, index, part, len(pieces)), piece) for part, piece in enumerate(pieces)]

    async def _kept(self, run_id: str, index: _Index, messages: Any) -> int | None:
        """How many leading messages of `messages` are stored already (reading them if the cache cannot tell);
        None when the stored data is damaged (the save replaces all of it)."""
        known = self._cache.kept(run_id, index.revision, messages)
        if known is not None:
            return known
        try:
            stored = self._records(run_id, index)[1]
        except CheckpointCorruptError:
            return None
        return kept_by_encoding(await self._comparable(run_id, stored), messages)

    def _records(self, run_id: str, index: _Index) -> tuple[str, builtins.list[str]]:
        """The header and message texts of a run, checked part by part against its index."""
        base = self._data_prefix(run_id)
        header: list[str] = []
        bodies: list[list[str]] = []
        totals: list[int] = []
        for key, value in self._kv.list(prefix=base):
            found = _PART.fullmatch(key[len(base) :])
            if found is None or not isinstance(value, str):
                raise CheckpointCorruptError(f"stored entry {key!r} is not part of a checkpoint", run_id=run_id)
            tag, seq, part, total = found[1], int(found[2]), int(found[3]), int(found[4])
            if tag == "h":
                if seq != 0 or part != len(header) or total != index.header_parts:
                    raise CheckpointCorruptError(f"header part {key!r} is out of place", run_id=run_id)
                header.append(value)
                continue
            if part == 0 and seq == len(bodies) and (not bodies or len(bodies[-1]) == totals[-1]):
                bodies.append([])
                totals.append(total)
            if not bodies or seq != len(bodies) - 1 or part != len(bodies[-1]) or total != totals[-1]:
                raise CheckpointCorruptError(f"message part {key!r} is out of place", run_id=run_id)
            bodies[-1].append(value)
        if len(header) != index.header_parts:
            raise CheckpointCorruptError(
                f"the header has {len(header)} of its {index.header_parts} parts", run_id=run_id
            )
        if len(bodies) != index.count or (bodies and len(bodies[-1]) != totals[-1]):
            raise CheckpointCorruptError(
                f"the index counts {index.count} messages, the storage holds {len(bodies)} (the last one "
                f"complete: {bool(bodies) and len(bodies[-1]) == totals[-1]})",
                run_id=run_id,
            )
        return "".join(header), ["".join(parts) for parts in bodies]

    def _delete_data(self, run_id: str, start: str | None = None) -> None:
        """Delete the run's data entries (from key `start` on, when given)."""
        base = self._data_prefix(run_id)
        options = {"prefix": base} if start is None else {"prefix": base, "start": base + start}
        for key in [key for key, _ in self._kv.list(**options)]:
            self._kv.delete(key)

    def _step_prefix(self, run_id: str) -> str:
        return f"{self._prefix}step:{len(run_id)}:{run_id}:"

    def _log_step(self, run_id: str, step_index: int, count: int, kept: int | None, header: str) -> None:
        """Record the save at `step_index` in the step log, dropping the entries it replaces.

        `kept` is where a rewrite of the stored messages began (None: nothing was rewritten);
        only then is the whole log read, so an appending save reads only the entries it replaces.
        """
        base = self._step_prefix(run_id)
        if kept is None:
            doomed = [key for key, _ in self._kv.list(prefix=base, start=f"{base}{step_index:012d}")]
        else:
            doomed = [
                key
                for key, value in self._kv.list(prefix=base)
                if key >= f"{base}{step_index:012d}" or (_step_entry(value) or (kept + 1, ""))[0] > kept
            ]
        for key in doomed:
            self._kv.delete(key)
        key = f"{base}{step_index:012d}"
        value = json.dumps({"n": count, "h": header}, ensure_ascii=False, separators=(",", ":"))
        if len(key.encode("utf-8")) + len(value.encode("utf-8")) + _MARGIN <= self._max:
            self._kv.put(key, value)

    def _delete_steps(self, run_id: str) -> None:
        for key in [key for key, _ in self._kv.list(prefix=self._step_prefix(run_id))]:
            self._kv.delete(key)

    def _index(self, run_id: str) -> tuple[_Index | None, bool]:
        """The run's index entry (None when absent or damaged) and whether an entry exists at all."""
        value = self._kv.get(self._run_key(run_id))
        return (None, False) if value is None else (_Index.parse(value), True)

    # -- the CheckpointStore surface ------------------------------------------------------------

    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        """Store `checkpoint` as its run's latest, writing only the messages not stored yet.

        The rows are sealed first, against the run as read; then one storage transaction writes them if the
        run's index entry is still the one read, else the save starts over from the new state (module docs).
        """
        run_id, messages = checkpoint.run_id, checkpoint.messages
        header = await self._header_row(checkpoint)  # a CodecError here writes nothing
        with self._cache.forgetting(run_id):
            while True:
                index = self._index(run_id)[0]
                guard(run_id, expected, index)
                keep = 0 if index is None else await self._kept(run_id, index, messages)
                bodies = await self._message_rows(run_id, messages, keep or 0)
                revision = self._atomic(partial(self._write, checkpoint, index, keep, header, bodies))
                if revision is not None:
                    break
        self._cache.remember_save(checkpoint, revision)

    def _write(
        self, checkpoint: AgentCheckpoint, seen: _Index | None, keep: int | None, header: str, bodies: Sequence[str]
    ) -> int | None:
        """Inside the save's transaction: the rows of `checkpoint` (the `header` and messages `keep`... as
        `bodies`), sealed against the index entry `seen`, written when the run still has that entry. Returns the
        revision written, or None (the run changed since `seen` was read: nothing written)."""
        run_id = checkpoint.run_id
        if self._index(run_id)[0] != seen:
            return None
        base = self._data_prefix(run_id)
        header_entries = self._parts(base, "h", 0, header)
        rewrote_from: int | None = None
        start = keep or 0
        if seen is None:  # a new run, or a damaged index entry: whatever data it left goes
            self._delete_data(run_id)
            self._delete_steps(run_id)
        else:
            if keep is None:  # damaged data: every data entry goes, the messages are written again
                self._delete_data(run_id)
            if start < seen.count:
                self._delete_data(run_id, f"m{start:010d}")
                rewrote_from = start
            if seen.header_parts != len(header_entries):  # else the new parts overwrite the old
                for part in range(seen.header_parts):
                    self._kv.delete(_part_key(base, "h", 0, part, seen.header_parts))
        for i, body in enumerate(bodies):
            for key, value in self._parts(base, "m", start + i, body):
                self._kv.put(key, value)
        for key, value in header_entries:
            self._kv.put(key, value)
        revision = new_revision()
        entry = _Index(
            checkpoint.status,
            checkpoint.step_index,
            checkpoint.created_at,
            len(checkpoint.messages),
            revision,
            len(header_entries),
        )
        self._kv.put(self._run_key(run_id), entry.dumps())
        self._log_step(run_id, checkpoint.step_index, len(checkpoint.messages), rewrote_from, header)
        return revision

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        index, exists = self._index(run_id)
        if not exists:
            return None
        with self._cache.forgetting(run_id, DAMAGE):
            if index is None:
                raise CheckpointCorruptError("the run's index entry is unreadable", run_id=run_id)
            header, bodies = self._records(run_id, index)
            checkpoint = await self._rebuild(run_id, index.step_index, header, bodies)
        self._cache.remember(run_id, index.revision, checkpoint.messages)
        return checkpoint

    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        index, exists = self._index(run_id)
        value = self._kv.get(f"{self._step_prefix(run_id)}{step_index:012d}")
        if not exists or value is None:
            return None
        entry = _step_entry(value)
        if index is None or entry is None or entry[0] > index.count:
            raise CheckpointCorruptError(f"the step log entry of step {step_index} is unreadable", run_id=run_id)
        count, header = entry
        return await self._rebuild(run_id, step_index, header, self._records(run_id, index)[1][:count])

    async def _delete(self, run_id: str) -> None:
        self._delete_run(run_id)

    def _delete_run(self, run_id: str) -> None:
        def work() -> None:
            self._kv.delete(self._run_key(run_id))
            self._delete_data(run_id)
            self._delete_steps(run_id)

        self._atomic(work)
        self._cache.forget(run_id)

    def _indexes(self) -> builtins.list[tuple[str, _Index]]:
        """Every run's id and index entry; damaged entries are logged and skipped."""
        start = f"{self._prefix}run:"
        found = []
        for key, value in self._kv.list(prefix=start):
            index = _Index.parse(value)
            if index is None:
                logger.warning("Durable Object store: skipping the damaged index entry %r", key)
                continue
            found.append((key[len(start) :], index))
        return found

    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]:
        return listing(status, limit, after)(self._indexes())

    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]:
        doomed = pruning(before, status, include_suspended)(self._indexes())
        for run_id in doomed:  # no await in between: no other request's save interleaves
            self._delete_run(run_id)
        return doomed

    async def _rekey_batch(self, rekeyer: Rekeyer, position: str | None, batch_size: int) -> tuple[RekeyReport, str | None]:
        """One batch of `durable_agent.encryption.rekey`: the next `batch_size` runs (by id), each rewritten in one
        storage transaction, only if the run still holds what was read (a save may interleave while the async
        face awaits the keyring: that run is counted `changed`)."""
        runs = sorted(run_id for run_id, _ in self._indexes() if position is None or run_id > position)[:batch_size]
        total = RekeyReport()
        for run_id in runs:
            try:
                total += await self._rekey_run(rekeyer, run_id)
            except CheckpointCorruptError as exc:
                total += RekeyReport(examined=1, refused=1, refusals=(str(exc),))
        return replace(total, batches=1), runs[-1] if len(runs) == batch_size else None

    def _stored_rows(self, run_id: str, index: _Index) -> _StoredRows:
        """A run's header, message and step log texts as stored (`_records`, the step log's entries)."""
        header, bodies = self._records(run_id, index)
        logged = [(key, _step_entry(value)) for key, value in self._kv.list(prefix=self._step_prefix(run_id))]
        return header, bodies, logged

    async def _rekey_run(self, rekeyer: Rekeyer, run_id: str) -> RekeyReport:
        """Rekey one run's header, messages and step log entries (see `_rekey_batch`)."""
        index = self._index(run_id)[0]
        if index is None:
            return RekeyReport()  # deleted, or damaged: its next save replaces it
        read = self._stored_rows(run_id, index)
        header, bodies, logged = read
        steps = self._step_prefix(run_id)
        rows: builtins.list[tuple[Any, Place]] = [(header, (HEADER, run_id, index.step_index))]
        rows += [(body, (MESSAGE, run_id, seq)) for seq, body in enumerate(bodies)]
        for key, entry in logged:
            if entry is None:
                raise CheckpointCorruptError(f"the step log entry {key!r} is unreadable", run_id=run_id)
            rows.append((entry[1], (HEADER, run_id, int(key[len(steps) :]))))
        report, writes = await self._rekeyed(rekeyer, rows)
        if not writes:
            return report
        if self._atomic(partial(self._rekey_write, run_id, index, read, writes)):
            return replace(report, rewritten=len(writes))
        return replace(report, changed=len(writes))

    def _rekey_write(self, run_id: str, index: _Index, read: _StoredRows, writes: Writes) -> bool:
        """Inside the rekey's transaction: write `writes` (positions in `_rekey_run`'s rows) if the run still
        holds `read` under the index entry `index`; whether it did."""
        if self._index(run_id)[0] != index or self._stored_rows(run_id, index) != read:
            return False
        _, bodies, logged = read
        base = self._data_prefix(run_id)
        for at, value in writes:
            if at == 0:
                parts = self._rewrite_parts(base, "h", 0, value)
                self._kv.put(self._run_key(run_id), replace(index, header_parts=parts).dumps())
            elif at <= len(bodies):
                self._rewrite_parts(base, "m", at - 1, value)
            else:
                key, entry = logged[at - 1 - len(bodies)]
                assert entry is not None
                self._kv.put(key, json.dumps({"n": entry[0], "h": value}, ensure_ascii=False, separators=(",", ":")))
        return True

    def _rewrite_parts(self, base: str, tag: str, index: int, text: str) -> int:
        """Replace the entries of one header or message by `text`'s parts; how many parts it has now."""
        for key in [key for key, _ in self._kv.list(prefix=f"{base}{tag}{index:010d}.")]:
            self._kv.delete(key)
        entries = self._parts(base, tag, index, text)
        for key, value in entries:
            self._kv.put(key, value)
        return len(entries)


class DurableObjectCheckpointStore(_DurableObjectStore, SyncFace):
    """A `CheckpointStore` over `ctx.storage.kv` of a SQLite-backed Durable Object, synchronous (see the module
    docs).

    `storage` is the object's `ctx.storage`. Several runs may share one object (keys are
    prefixed with `prefix`). `max_entry_bytes` is the storage's limit for key and value
    together (lower it only to test the splitting). `encryption`: a `durable_agent.encryption.Keyring`
    that seals every message and header entry (README, "Encryption at rest"). Its synchronous
    `seal`/`open` need the `cryptography` package (in a Worker, Pyodide's); where only WebCrypto exists
    (a Worker without it), use `AsyncDurableObjectCheckpointStore`: the same entries, awaited.
    """

    async def _header_row(self, checkpoint: AgentCheckpoint) -> str:
        return self._sealer.header_row(checkpoint)

    async def _message_rows(self, run_id: str, messages: Sequence[Message], start: int) -> builtins.list[str]:
        return self._sealer.message_rows(run_id, messages, start)

    async def _rebuild(self, run_id: str, step_index: int, header: str, bodies: Sequence[str]) -> AgentCheckpoint:
        return self._sealer.rebuild(run_id, step_index, header, bodies)

    async def _comparable(self, run_id: str, bodies: Sequence[str]) -> Sequence[Any]:
        return self._sealer.comparable(run_id, bodies)

    async def _rekeyed(self, rekeyer: Rekeyer, rows: Sequence[tuple[Any, Place]]) -> tuple[RekeyReport, Writes]:
        return rekeyer.batch(rows)

    def close(self) -> None:
        """Nothing to release: the storage belongs to the Durable Object."""
        self._cache.clear()


class AsyncDurableObjectCheckpointStore(_DurableObjectStore, AsyncFace):
    """`DurableObjectCheckpointStore` with coroutine methods (``await store.save(...)``), which seal and open
    rows through the keyring's `seal_async`/`open_async`: with ``encryption=keyring`` it runs where WebCrypto
    (``crypto.subtle``) is the only AES-GCM, as in a Cloudflare Worker without the `cryptography` package.

    Same entries, places and rules as the synchronous store: the two read and write each other's runs, and
    may share a prefix. A save seals its rows before its storage transaction, against the run as read; other
    requests to the object may run while it awaits WebCrypto, so the transaction writes only if the run's
    index entry is unchanged, and otherwise the save starts over (module docs). Rekey it with
    `durable_agent.encryption.rekey_async`.
    """

    async def _header_row(self, checkpoint: AgentCheckpoint) -> str:
        return await self._sealer.header_row_async(checkpoint)

    async def _message_rows(self, run_id: str, messages: Sequence[Message], start: int) -> builtins.list[str]:
        return await self._sealer.message_rows_async(run_id, messages, start)

    async def _rebuild(self, run_id: str, step_index: int, header: str, bodies: Sequence[str]) -> AgentCheckpoint:
        return await self._sealer.rebuild_async(run_id, step_index, header, bodies)

    async def _comparable(self, run_id: str, bodies: Sequence[str]) -> Sequence[Any]:
        return await self._sealer.comparable_async(run_id, bodies)

    async def _rekeyed(self, rekeyer: Rekeyer, rows: Sequence[tuple[Any, Place]]) -> tuple[RekeyReport, Writes]:
        return await rekeyer.batch_async(rows)

    async def close(self) -> None:
        """Nothing to release: the storage belongs to the Durable Object."""
        self._cache.clear()
