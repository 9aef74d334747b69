"""Redis checkpoint stores (redis-py): `RedisCheckpointStore` (sync) and `AsyncRedisCheckpointStore` (`redis.asyncio`).

Checkpoints append-only per run, atomic saves. The two stores run one implementation of the
logic (`_RedisStore`) over the same keys and scripts, and may share a prefix.

Keys, under `prefix` (default ``durable_agent:``): ``run:<id>`` a hash (header, revision, step,
status, created_at, count), ``msgs:<id>`` a list of encoded messages, ``runs`` and
``status:<status>`` sorted sets (all scores 0, so ranges are lexicographic) for `list`, and
``steps:<id>`` the step log (`load_step`, for `durable_agent._fork`): a list of
``"<step_index> <message count> <header>"`` entries ordered by step, kept by the save script
under the rules of `durable_agent._storage.step_log` (it pops from the end: O(1) amortized).

A save is one Lua script, so it is atomic: it checks the optional `expected_step_index` and
that the run's revision is still the one this process wrote last, trims the list to the
messages kept, pushes the new ones and rewrites the header. A message list holding fewer
messages than the caller knows stored (replaced by another key type, or cut short) fails
the save with `CheckpointCorruptError`: appending to what is left would store a history
nobody saved. A process whose view is stale
(another writer, a restart) gets "stale" back, reads the run in one MULTI, and saves again
with exact knowledge: no gap, no duplicate. A connection lost mid-save leaves the script
either fully applied or not at all; the next save finds out which.

Damage stays the damaged run's problem: loading it raises `CheckpointCorruptError` naming it
(undecodable data, counts that disagree, a key holding another Redis type), and its next save
replaces it. `list` and `prune` skip, and log, an index member that is not UTF-8 and a header
whose status or created_at is unreadable, and go on with the other runs.

Durability, honestly: Redis acknowledges a write once it is in memory. What survives a crash
of the Redis server depends on its configuration, not on this store:
* no persistence (``save ''``, ``appendonly no``): every checkpoint is lost on restart;
* RDB snapshots only: the saves since the last snapshot (often minutes) are lost;
* ``appendonly yes`` with ``appendfsync everysec`` (the usual setting): up to about a second
  of acknowledged saves can be lost; ``appendfsync always`` loses none, at a cost per save;
* replication is asynchronous: a failover to a replica can lose acknowledged saves (and
  bring back an older revision: the store then heals, but the lost steps are gone).
Use Postgres or SQLite when a saved checkpoint must survive the store's own crash; use
Redis for speed with the persistence you configured, knowing the window above.

Install with ``pip install 'durable-agent[redis]'``.
"""

from __future__ import annotations

import builtins
import importlib
import re
from abc import abstractmethod
from dataclasses import replace
from typing import Any

from .._checkpoint import RUN_STATUSES, AgentCheckpoint, RunStatus
from .._errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    ConfigurationError,
    FeatureUnavailableError,
)
from .._storage.faces import AsyncFace, StoreLogic, SyncFace
from .._storage.history import PrefixCache, kept_by_encoding, new_revision
from .._storage.sealing import DAMAGE, HEADER, MESSAGE, row_sealer
from .._storage.validate import logger, page, prunable, readable_ids
from ..encryption import Keyring
from ..encryption._rekey import Rekeyer, RekeyReport

# KEYS: head, msgs, runs, status:running, status:suspended, status:completed, steps
# ARGV: run_id, expected step ('' = no check), known revision ('' = absent), keep, revision,
#       step_index, status, created_at, header, bodies...
_SAVE = """
-- a key of the wrong type (damage, or another program's key) is replaced, like any corrupt run
local want = {'hash', 'list', [7] = 'list'}
local replaced = {}
for _, k in ipairs({1, 2, 7}) do
  local t = redis.call('TYPE', KEYS[k])['ok']
  if t ~= 'none' and t ~= want[k] then redis.call('DEL', KEYS[k]); replaced[k] = t end
end
local head = redis.call('HMGET', KEYS[1], 'revision', 'step_index')
if ARGV[2] ~= '' and head[2] ~= ARGV[2] then
  return {'conflict', head[2] or ''}
end
if (head[1] or '') ~= ARGV[3] then
  return {'stale', ''}
end
local keep = tonumber(ARGV[4])
if keep > redis.call('LLEN', KEYS[2]) then  -- the list lost messages the caller saw stored: damage
  return {'corrupt', replaced[2] or ''}
end
if ARGV[3] == '' then redis.call('DEL', KEYS[7]) end  -- a new run: no stray step log
local step = tonumber(ARGV[6])
local rewrote = keep < redis.call('LLEN', KEYS[2])
while true do
  local last = redis.call('LINDEX', KEYS[7], -1)
  if not last then break end
  local s, n = string.match(last, '^(%d+) (%d+) ')
  if s and tonumber(s) < step and not (rewrote and tonumber(n) > keep) then break end
  redis.call('RPOP', KEYS[7])
end
if keep < redis.call('LLEN', KEYS[2]) then
  if keep == 0 then
    redis.call('DEL', KEYS[2])
  else
    redis.call('LTRIM', KEYS[2], 0, keep - 1)
  end
end
local last = #ARGV
local i = 10
while i <= last do
  local j = math.min(i + 999, last)
  redis.call('RPUSH', KEYS[2], unpack(ARGV, i, j))
  i = j + 1
end
redis.call('HSET', KEYS[1], 'revision', ARGV[5], 'step_index', ARGV[6], 'status', ARGV[7],
  'created_at', ARGV[8], 'header', ARGV[9], 'count', redis.call('LLEN', KEYS[2]))
redis.call('RPUSH', KEYS[7], ARGV[6] .. ' ' .. redis.call('LLEN', KEYS[2]) .. ' ' .. ARGV[9])
redis.call('ZADD', KEYS[3], 0, ARGV[1])
local by_status = {running = KEYS[4], suspended = KEYS[5], completed = KEYS[6]}
for _, key in pairs(by_status) do redis.call('ZREM', key, ARGV[1]) end
redis.call('ZADD', by_status[ARGV[7]], 0, ARGV[1])
return {'ok', ''}
"""

# KEYS as for _SAVE; ARGV: run_id, revision the caller saw ('' = delete whatever is there)
_DELETE = """
if ARGV[2] ~= '' and redis.call('HGET', KEYS[1], 'revision') ~= ARGV[2] then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[7])
for k = 3, 6 do redis.call('ZREM', KEYS[k], ARGV[1]) end
return 1
"""

# KEYS: head, msgs, steps; ARGV: revision read, header ('' = unchanged), m, then m pairs (message index, body),
#       then pairs (step log index, entry): the values of a rekey, written only while the run is at that revision
_REKEY = """
if redis.call('HGET', KEYS[1], 'revision') ~= ARGV[1] then
  return 0
end
if ARGV[2] ~= '' then redis.call('HSET', KEYS[1], 'header', ARGV[2]) end
local i = 4
for _ = 1, tonumber(ARGV[3]) do
  redis.call('LSET', KEYS[2], ARGV[i], ARGV[i + 1])
  i = i + 2
end
while i <= #ARGV do
  redis.call('LSET', KEYS[3], ARGV[i], ARGV[i + 1])
  i = i + 2
end
return 1
"""


def _redis(module: str = "redis") -> Any:
    """redis-py's `module` (``redis`` or ``redis.asyncio``), or `FeatureUnavailableError`."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise FeatureUnavailableError(
            f"the Redis store needs redis-py: pip install 'durable-agent[redis]' ({exc})"
        ) from exc


def _text(value: Any, run_id: str, what: str) -> str:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError:
            raise CheckpointCorruptError(f"{what} is not UTF-8", run_id=run_id) from None
    raise CheckpointCorruptError(f"{what} is missing", run_id=run_id)


def _texts(bodies: list[Any], run_id: str) -> list[str]:
    """The message bodies as text, in one pass; per body only to name a bad one (`_text`)."""
    try:
        return [body.decode("utf-8") for body in bodies]
    except (AttributeError, UnicodeDecodeError):
        return [_text(body, run_id, f"message {seq}") for seq, body in enumerate(bodies)]


def _int(value: Any) -> int | None:
    """A stored decimal number (bytes), or None when it is not one."""
    return int(value) if isinstance(value, bytes) and re.fullmatch(rb"-?[0-9]+", value) else None


def _limit(limit: int | None) -> tuple[int, ...]:
    """ZRANGEBYLEX's LIMIT arguments (offset, count), none for no limit."""
    return () if limit is None else (0, limit)


def _prune_fields(run_id: str, fields: Any) -> tuple[str, int, bytes] | None:
    """(status, created_at, revision) of a run's header for `prune`, or None, logged, when damaged."""
    if not isinstance(fields, Exception):
        st, created, revision = fields
        try:
            if revision is not None and created is not None and re.fullmatch(rb"-?[0-9]+", created):
                return st.decode("utf-8"), int(created), revision
        except (AttributeError, UnicodeDecodeError):
            pass
    logger.warning("Redis store: prune skips run %r, whose header is damaged (%r)", run_id, fields)
    return None


class _RedisStore(StoreLogic):
    """The store's logic, written once as coroutines over three kinds of Redis call.

    `RedisCheckpointStore` makes those calls with a sync client (they complete at once: its
    methods drive the logic with `run_now`), `AsyncRedisCheckpointStore` with a `redis.asyncio` one.
    """

    _module: str  # redis-py's module whose `Redis` the store makes from a URL

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        prefix: str = "durable_agent:",
        cache_runs: int = 256,
        encryption: Keyring | None = None,
    ) -> None:
        redis = _redis(self._module)
        if (url is None) == (client is None):
            raise ConfigurationError(f"{type(self).__name__} needs exactly one of url= or client=")
        if not isinstance(prefix, str):
            raise ConfigurationError(f"prefix must be a str, got {prefix!r}")
        self._own_client = client is None
        if client is None:
            if not isinstance(url, str):
                raise ConfigurationError(f"url must be a str, got {url!r}")
            try:  # a bad port ("redis://:notaport", 99999) or scheme is a ValueError in redis-py
                client = redis.Redis.from_url(url)
            except (ValueError, TypeError) as exc:
                raise ConfigurationError(f"bad Redis URL {url!r}: {exc}") from None
        self._client = client
        self._prefix = prefix
        self._save_script = self._client.register_script(_SAVE)
        self._delete_script = self._client.register_script(_DELETE)
        self._rekey_script = self._client.register_script(_REKEY)
        self._cache = PrefixCache(cache_runs)
        self._sealer = row_sealer(encryption)

    # The calls, one implementation per client kind.

    @abstractmethod
    async def _pipeline(self, transaction: bool, *commands: tuple[str, Any]) -> builtins.list[Any]:
        """The replies of `commands` ((name, args) pairs) sent in one pipeline; a failed one's is its error."""

    @abstractmethod
    async def _eval(self, script: Any, keys: builtins.list[str], args: builtins.list[Any]) -> Any:
        """Run a registered Lua `script` (`_save_script`, `_delete_script`, `_rekey_script`)."""

    @abstractmethod
    async def _range(self, key: str, low: bytes, limit: int | None) -> builtins.list[bytes]:
        """ZRANGEBYLEX `key` from `low` to the end, at most `limit` members."""

    def _queue(self, transaction: bool, commands: tuple[tuple[str, Any], ...]) -> Any:
        """A pipeline of the client holding `commands`, not sent yet."""
        pipe = self._client.pipeline(transaction=transaction)
        for name, args in commands:
            getattr(pipe, name)(*args)
        return pipe

    # The logic.

    def _keys(self, run_id: str) -> builtins.list[str]:
        p = self._prefix
        return [
            f"{p}run:{run_id}",
            f"{p}msgs:{run_id}",
            f"{p}runs",
            *(f"{p}status:{s}" for s in RUN_STATUSES),
            f"{p}steps:{run_id}",
        ]

    async def _read(self, run_id: str) -> tuple[dict[bytes, bytes], builtins.list[Any], str | None]:
        """The run's header hash and message list, read in one MULTI (one consistent view).

        The third item says what is wrong when a key holds another type (WRONGTYPE): then the
        hash and list read as empty, and a save replaces the keys.
        """
        head_key, msgs_key = self._keys(run_id)[:2]
        head, bodies = await self._pipeline(True, ("hgetall", (head_key,)), ("lrange", (msgs_key, 0, -1)))
        if isinstance(head, Exception) or isinstance(bodies, Exception):
            wrong = head if isinstance(head, Exception) else bodies
            return {}, [], f"a key of the run holds another type ({wrong})"
        return head, bodies, None

    async def _save(self, checkpoint: AgentCheckpoint, expected: int | None) -> None:
        run_id, messages = checkpoint.run_id, checkpoint.messages
        header = self._sealer.header_row(checkpoint)
        cached = self._cache.revision(run_id)
        keep = None if cached is None else self._cache.kept(run_id, cached, messages)
        known: bytes = b"" if cached is None else str(cached).encode()
        while True:  # each round trip either saves or learns of a newer save by another writer
            if keep is None:  # read what is stored and compare exactly
                head, bodies, _ = await self._read(run_id)
                raw = head.get(b"revision")
                known = raw or b""  # compared as stored: a damaged revision must not make every try stale
                stored = [body.decode("utf-8", "replace") for body in bodies]
                keep = kept_by_encoding(self._sealer.comparable(run_id, stored), messages) if raw is not None else 0
            revision = new_revision()
            outcome, actual = await self._eval(
                self._save_script,
                self._keys(run_id),
                [
                    run_id,
                    "" if expected is None else str(expected),
                    known,
                    keep,
                    revision,
                    checkpoint.step_index,
                    checkpoint.status,
                    checkpoint.created_at,
                    header,
                    *self._sealer.message_rows(run_id, messages, keep),
                ],
            )
            if outcome == b"conflict":
                raise CheckpointConflictError(run_id, expected, int(actual) if actual else None)
            if outcome == b"corrupt":
                self._cache.forget(run_id)  # the next save reads what is stored and rewrites the run
                damage = f"was a {actual.decode()} (deleted)" if actual else "holds fewer messages than were saved"
                raise CheckpointCorruptError(
                    f"the run's message list {damage}; this save would have stored a history nobody saved",
                    run_id=run_id,
                )
            if outcome == b"ok":
                self._cache.remember_save(checkpoint, revision)
                return
            keep = None  # stale: another writer saved this run since we last looked
            self._cache.forget(run_id)

    async def _load(self, run_id: str) -> AgentCheckpoint | None:
        head, bodies, wrong = await self._read(run_id)
        with self._cache.forgetting(run_id, DAMAGE):
            if wrong is not None:
                raise CheckpointCorruptError(wrong, run_id=run_id)
            if not head:
                return None
            revision, count = head.get(b"revision", b""), head.get(b"count", b"")
            if not (revision.isdigit() and count.isdigit()):
                raise CheckpointCorruptError("the header's revision/count are not numbers", run_id=run_id)
            if int(count) != len(bodies):
                raise CheckpointCorruptError(
                    f"header counts {int(count)} messages, the list holds {len(bodies)}", run_id=run_id
                )
            checkpoint = self._sealer.rebuild(
                run_id, _int(head.get(b"step_index")), _text(head.get(b"header"), run_id, "header"),
                _texts(bodies, run_id),
            )
        self._cache.remember(run_id, int(revision), checkpoint.messages)
        return checkpoint

    async def _load_step(self, run_id: str, step_index: int) -> AgentCheckpoint | None:
        keys = self._keys(run_id)
        exists, entries, bodies = await self._pipeline(
            True, ("exists", (keys[0],)), ("lrange", (keys[6], 0, -1)), ("lrange", (keys[1], 0, -1))
        )
        if any(isinstance(v, Exception) for v in (exists, entries, bodies)):
            raise CheckpointCorruptError("a key of the run holds another type", run_id=run_id)
        if not exists:
            return None
        for entry in entries:
            step, count, header = _step_entry(entry, run_id)
            if step == step_index:
                if count > len(bodies):
                    raise CheckpointCorruptError(f"step {step_index} counts {count} messages", run_id=run_id)
                return self._sealer.rebuild(
                    run_id, step_index, _text(header, run_id, f"the header of step {step_index}"),
                    _texts(bodies[:count], run_id),
                )
        return None

    async def _delete(self, run_id: str) -> None:
        await self._eval(self._delete_script, self._keys(run_id), [run_id, ""])
        self._cache.forget(run_id)

    async def _members(self, status: RunStatus | None, limit: int | None, after: bytes | None) -> builtins.list[bytes]:
        """Raw members of the run index (all runs, or those of `status`) after `after`, in byte order."""
        key = f"{self._prefix}{'runs' if status is None else 'status:' + status}"
        return await self._range(key, b"-" if after is None else b"(" + after, limit)

    async def _list(self, status: RunStatus | None, limit: int | None, after: str | None) -> builtins.list[str]:
        return readable_ids(await self._members(status, limit, None if after is None else after.encode("utf-8")))

    async def _prune(self, before: int, status: RunStatus | None, include_suspended: bool) -> builtins.list[str]:
        doomed: builtins.list[str] = []
        after = None
        while members := await self._members(None, 500, after):
            after = members[-1]
            page_ids = readable_ids(members)
            replies = await self._pipeline(
                False, *(("hmget", (self._keys(run_id)[0], "status", "created_at", "revision")) for run_id in page_ids)
            )
            for run_id, fields in zip(page_ids, replies, strict=True):
                found = _prune_fields(run_id, fields)
                if found is not None and prunable(found[0], found[1], before, status, include_suspended):
                    if await self._eval(self._delete_script, self._keys(run_id), [run_id, found[2]]):
                        doomed.append(run_id)
                        self._cache.forget(run_id)
        return page(doomed, None, None)

    async def _rekey_batch(self, rekeyer: Rekeyer, position: bytes | None, batch_size: int) -> tuple[RekeyReport, bytes | None]:
        """One batch of `durable_agent.encryption.rekey`: the next `batch_size` runs of the index, each rewritten
        by one script (`_REKEY`) that applies only while the run is at the revision read (a save meanwhile
        changed it: its rows are the save's, counted `changed`)."""
        members = await self._members(None, batch_size, position)
        total = RekeyReport()
        for run_id in readable_ids(members):
            try:
                total += await self._rekey_run(rekeyer, run_id)
            except CheckpointCorruptError as exc:
                total += RekeyReport(examined=1, refused=1, refusals=(str(exc),))
        return replace(total, batches=1), members[-1] if len(members) == batch_size else None

    async def _rekey_run(self, rekeyer: Rekeyer, run_id: str) -> RekeyReport:
        """Rekey one run's header, messages and step log (see `_rekey_batch`)."""
        keys = self._keys(run_id)
        head, bodies, entries = await self._pipeline(
            True, ("hmget", (keys[0], "revision", "step_index", "header")), ("lrange", (keys[1], 0, -1)),
            ("lrange", (keys[6], 0, -1)),
        )
        if any(isinstance(reply, Exception) for reply in (head, bodies, entries)):
            raise CheckpointCorruptError("a key of the run holds another type", run_id=run_id)
        revision, step_index, header = head
        if revision is None:
            return RekeyReport()  # deleted since it was listed
        rows: builtins.list[tuple[Any, tuple[str | int, ...]]] = [
            (_text(header, run_id, "header"), (HEADER, run_id, _int(step_index) or 0))
        ]
        rows += [(body, (MESSAGE, run_id, seq)) for seq, body in enumerate(_texts(bodies, run_id))]
        logged = [_step_entry(entry, run_id) for entry in entries]
        rows += [(_text(raw, run_id, f"the header of step {step}"), (HEADER, run_id, step)) for step, _, raw in logged]
        report, writes = rekeyer.batch(rows)
        if not writes:
            return report
        args: builtins.list[Any] = [revision, next((value for at, value in writes if at == 0), "")]
        messages = [(at - 1, value) for at, value in writes if 0 < at <= len(bodies)]
        args.append(len(messages))
        for at, value in messages:
            args += [at, value]
        for at, value in writes:
            if at > len(bodies):
                step, count, _ = logged[at - 1 - len(bodies)]
                args += [at - 1 - len(bodies), f"{step} {count} {value}"]
        if await self._eval(self._rekey_script, [keys[0], keys[1], keys[6]], args):
            return replace(report, rewritten=len(writes))
        return replace(report, changed=len(writes))


def _step_entry(entry: bytes, run_id: str) -> tuple[int, int, bytes]:
    """A step log entry's step index, message count and header (as stored)."""
    found = re.match(rb"([0-9]+) ([0-9]+) ", entry)
    if found is None:
        raise CheckpointCorruptError("a step log entry is unreadable", run_id=run_id)
    return int(found[1]), int(found[2]), entry[found.end() :]


class RedisCheckpointStore(_RedisStore, SyncFace):
    """Checkpoints in Redis; synchronous methods, safe for many processes (see the durability notes).

    Give a `url` (``redis://host:port/db``) or a ready `client` (a `redis.Redis` with
    ``decode_responses=False``). `prefix` namespaces the keys. A run saved again while `prune`
    runs (its revision changed) is left alone. `encryption`: a `durable_agent.encryption.Keyring` that
    seals every message and header value (README, "Encryption at rest"); None stores them in plaintext. In an asyncio server use
    `AsyncRedisCheckpointStore`: this store's calls wait for Redis on the caller's thread.
    """

    _module = "redis"

    async def _pipeline(self, transaction: bool, *commands: tuple[str, Any]) -> builtins.list[Any]:
        return self._queue(transaction, commands).execute(raise_on_error=False)  # type: ignore[no-any-return]

    async def _eval(self, script: Any, keys: builtins.list[str], args: builtins.list[Any]) -> Any:
        return script(keys=keys, args=args)

    async def _range(self, key: str, low: bytes, limit: int | None) -> builtins.list[bytes]:
        return self._client.zrangebylex(key, low, b"+", *_limit(limit))  # type: ignore[no-any-return]

    def close(self) -> None:
        if self._own_client:
            self._client.close()
        self._cache.clear()


class AsyncRedisCheckpointStore(_RedisStore, AsyncFace):
    """`RedisCheckpointStore` with coroutine methods over `redis.asyncio`, for asyncio servers.

    Same keys, Lua scripts and rules: the two stores may share a prefix. Give a `url` or a
    ready `client` (a `redis.asyncio.Redis` with ``decode_responses=False``); the client
    connects on first use, inside the running event loop. `await store.close()` (or
    ``async with``) closes it.
    """

    _module = "redis.asyncio"

    async def _pipeline(self, transaction: bool, *commands: tuple[str, Any]) -> builtins.list[Any]:
        return await self._queue(transaction, commands).execute(raise_on_error=False)  # type: ignore[no-any-return]

    async def _eval(self, script: Any, keys: builtins.list[str], args: builtins.list[Any]) -> Any:
        return await script(keys=keys, args=args)

    async def _range(self, key: str, low: bytes, limit: int | None) -> builtins.list[bytes]:
        return await self._client.zrangebylex(key, low, b"+", *_limit(limit))  # type: ignore[no-any-return]

    async def close(self) -> None:
        if self._own_client:
            await self._client.aclose()
        self._cache.clear()
