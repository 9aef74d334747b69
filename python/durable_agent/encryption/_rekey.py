"""`rekey`: rewrite a store's sealed rows under its keyring's primary key, batch by batch.

The rule for one stored value is `Rekeyer.rekeyed`, written once; each backend only walks its rows
and writes back what the rule returns, each batch in one transaction of its own, the write made
only when the row still holds the value it read (compare-and-swap; a row rewritten meanwhile by a
live server is that server's, already under the primary). So a rekey:

* is resumable: what a batch wrote is committed and needs nothing again, what a killed batch wrote
  is rolled back whole, and a rerun walks the rows again, skipping the current ones;
* loses no concurrent save: a row a save changed between the read and the write is left as the
  save wrote it (`RekeyReport.changed`);
* migrates a plaintext database in place: a value that is not an envelope is sealed, unless
  `strict` (then it is refused, as a strict keyring refuses it on load: a plaintext row planted
  after the migration is not laundered into an envelope).

A value the keyring cannot open (a key it no longer holds, damage) is left as it is and counted in
`RekeyReport.refused`, with the first problems named (`DecryptionError` messages: the place, never
a key); the other rows are rekeyed. The backends: `durable_agent.backends._sql.rekey` (SQLite and
Postgres stores, runtimes and event logs), the Redis stores, the JSONL and Durable Object stores.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .._errors import ConfigurationError, DecryptionError
from .._util import run_now
from ._envelope import Place, envelope_key_id, marked
from ._keyring import Keyring

DEFAULT_BATCH_SIZE = 500
PLAINTEXT_REFUSED = "it is stored in plaintext, and the keyring is strict (Keyring(..., strict=True))"
REFUSALS_SHOWN = 20  # problems a report names; `refused` counts them all
_FORMS = {False: "text (damaged, or not UTF-8)", True: "envelopes"}


@dataclass(frozen=True, slots=True)
class RekeyReport:
    """What a rekey did: each row `examined` was `current` (under the primary already), `rewritten`
    under it, `changed` by another writer between the read and the write (left as that writer
    wrote it), or `refused` (it does not open with the keyring, or is plaintext under `strict`;
    left as it is). `refusals`: the first `REFUSALS_SHOWN` problems, each naming the row's place."""

    examined: int = 0
    rewritten: int = 0
    current: int = 0
    changed: int = 0
    refused: int = 0
    batches: int = 0
    refusals: tuple[str, ...] = field(default=())

    def __add__(self, other: RekeyReport) -> RekeyReport:
        return RekeyReport(
            self.examined + other.examined,
            self.rewritten + other.rewritten,
            self.current + other.current,
            self.changed + other.changed,
            self.refused + other.refused,
            self.batches + other.batches,
            (self.refusals + other.refusals)[:REFUSALS_SHOWN],
        )

    @property
    def complete(self) -> bool:
        """True when every row examined is now under the primary (nothing refused, nothing left to a writer
        that may hold an older keyring): the old keys can be dropped."""
        return self.refused == 0 and self.changed == 0


class Rekeyer:
    """The rule for one stored value of a rekey under `keyring` (see the module docs)."""

    def __init__(self, keyring: Keyring, *, strict: bool = False) -> None:
        if not isinstance(keyring, Keyring):
            raise ConfigurationError(f"rekey needs a durable_agent.encryption.Keyring, not {type(keyring).__name__}")
        if type(strict) is not bool:
            raise ConfigurationError(f"strict must be a bool, got {strict!r}")
        self.keyring = keyring
        self.strict = strict

    def rekeyed(self, value: Any, place: Place, *, binary: bool = False) -> Any:
        """None when `value` needs no rewrite (sealed with the primary, or NULL); else `value` sealed with
        the primary for `place`, in the form of its column (`binary`: bytes, else text; the plaintext's type
        kept).

        Raises `DecryptionError` for a value that does not open, for a plaintext one under `strict`, and for bytes
        in a text column (damage, never sealed as plaintext). Text in a binary column is a row written before
        the column held binary envelopes: a text envelope, or plaintext; it is rewritten in the binary form. A value is
        plaintext when it does not start with the envelope marker, as the stores read it
        (`durable_agent._storage.sealing`): a malformed envelope is refused, never sealed as plaintext.
        """
        found = self._examined(value, place, binary)
        if found is None:
            return None
        value, sealed = found
        plaintext = self.keyring.open(value, place) if sealed else value
        if binary:
            return self.keyring.seal(plaintext, place, binary=True)
        return self.keyring.seal(plaintext, place)

    async def rekeyed_async(self, value: Any, place: Place, *, binary: bool = False) -> Any:
        """`rekeyed` through the keyring's `open_async`/`seal_async` (so also on WebCrypto, in a Worker)."""
        found = self._examined(value, place, binary)
        if found is None:
            return None
        value, sealed = found
        plaintext = await self.keyring.open_async(value, place) if sealed else value
        if binary:
            return await self.keyring.seal_async(plaintext, place, binary=True)
        return await self.keyring.seal_async(plaintext, place)

    def _examined(self, value: Any, place: Place, binary: bool) -> tuple[str | bytes, bool] | None:
        """What `rekeyed` decides before any decryption: None (no rewrite), or the value to rewrite and whether
        it is sealed (else plaintext). Raises `DecryptionError` (see `rekeyed`)."""
        if value is None or (envelope_key_id(value) == self.keyring.primary and isinstance(value, bytes) == binary):
            return None
        if isinstance(value, (bytearray, memoryview)):
            value = bytes(value)
        if (isinstance(value, bytes) and not binary) or not isinstance(value, (str, bytes)):
            raise DecryptionError(tuple(place), f"it is {type(value).__name__}, in a column of {_FORMS[binary]}")
        sealed = marked(value)
        if isinstance(value, bytes) and not sealed:  # plaintext rows are text
            raise DecryptionError(tuple(place), "it is bytes without the envelope marker (damaged, or text not UTF-8)")
        if not sealed and self.strict:
            raise DecryptionError(tuple(place), PLAINTEXT_REFUSED)
        return value, sealed

    def batch(
        self, rows: Sequence[tuple[Any, Place]], *, binary: bool = False
    ) -> tuple[RekeyReport, list[tuple[int, Any]]]:
        """The rule over a batch of `(value, place)` rows of one form (`rekeyed`): the report of the rows that
        need no write (current, refused) and `(index, new value)` for each row to write back."""
        outcomes: list[Any] = []
        for value, place in rows:
            try:
                outcomes.append(self.rekeyed(value, place, binary=binary))
            except DecryptionError as exc:
                outcomes.append(exc)
        return _batch_report(outcomes)

    async def batch_async(
        self, rows: Sequence[tuple[Any, Place]], *, binary: bool = False
    ) -> tuple[RekeyReport, list[tuple[int, Any]]]:
        """`batch` through `rekeyed_async`."""
        outcomes: list[Any] = []
        for value, place in rows:
            try:
                outcomes.append(await self.rekeyed_async(value, place, binary=binary))
            except DecryptionError as exc:
                outcomes.append(exc)
        return _batch_report(outcomes)


def _batch_report(outcomes: Sequence[Any]) -> tuple[RekeyReport, list[tuple[int, Any]]]:
    """`Rekeyer.batch`'s result from each row's outcome: None (no write), a `DecryptionError` (refused) or the
    value to write."""
    refusals = [str(outcome) for outcome in outcomes if isinstance(outcome, DecryptionError)]
    writes = [
        (index, outcome) for index, outcome in enumerate(outcomes)
        if outcome is not None and not isinstance(outcome, DecryptionError)
    ]
    report = RekeyReport(
        examined=len(outcomes), current=len(outcomes) - len(writes) - len(refusals), refused=len(refusals), batches=1,
        refusals=tuple(refusals[:REFUSALS_SHOWN]),
    )
    return report, writes


Position = Any  # where a backend's walk stands: its own value, None before the first batch


class Rekeyable(Protocol):
    """A store or runtime that can be rekeyed: one batch at a time."""

    def _rekey_batch(
        self, rekeyer: Rekeyer, position: Position, batch_size: int
    ) -> Awaitable[tuple[RekeyReport, Position]]:
        """Rekey the batch of at most `batch_size` rows after `position` in one transaction: its report, and
        the position to go on from (None: no rows left)."""


Progress = Callable[[RekeyReport], None]


Step = Callable[[Rekeyer, Position, int], Awaitable[tuple[RekeyReport, Position]]]


def _step(target: Any, batch_size: int) -> Step:
    """`target`'s batch (`Rekeyable`), the arguments checked."""
    if type(batch_size) is not int or batch_size < 1:
        raise ConfigurationError(f"batch_size must be a positive int, got {batch_size!r}")
    step: Step | None = getattr(target, "_rekey_batch", None)
    if step is None:
        raise ConfigurationError(
            f"{type(target).__name__} cannot be rekeyed (the SQLite, Postgres, Redis, JSONL and Durable Object"
            " stores, the SQL runtimes and the SQL event logs can; the in-memory store keeps nothing at rest)"
        )
    return step


async def _rekeying(step: Step, rekeyer: Rekeyer, batch_size: int, progress: Progress | None) -> RekeyReport:
    total, position = RekeyReport(), None
    while True:
        report, position = await step(rekeyer, position, batch_size)
        total += report
        if progress is not None:
            progress(total)
        if position is None:
            return total


def rekey(
    store: Any,
    keyring: Keyring,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    strict: bool = False,
    progress: Progress | None = None,
) -> RekeyReport:
    """Rewrite every sealed row of `store` that is not under `keyring`'s primary key to it, plaintext rows
    included (unless `strict`): a rotation's last step, or the migration of an unencrypted database in place.

    `store`: a synchronous store (`SqliteCheckpointStore`, `PostgresCheckpointStore`,
    `RedisCheckpointStore`, `JsonlCheckpointStore`, `DurableObjectCheckpointStore`); `rekey_async` takes the async ones and the
    runtimes. Each batch of at most `batch_size` rows is rewritten in its own transaction, every
    write conditional on the row still holding what was read: safe beside live servers, and
    resumable (module docs). `progress` is called with the running total after each batch.
    Returns the `RekeyReport`; when `report.complete`, a keyring without the old keys loads everything.
    """
    rekeyer, step = Rekeyer(keyring, strict=strict), _step(store, batch_size)
    load = getattr(type(store), "load", None)  # a sync store's methods are plain functions (`rekey_async` else)
    if load is None or inspect.iscoroutinefunction(load):
        raise ConfigurationError(f"{type(store).__name__} is asynchronous: await rekey_async(store, keyring)")
    report: RekeyReport = run_now(_rekeying(step, rekeyer, batch_size, progress))
    return report


async def rekey_async(
    target: Any,
    keyring: Keyring,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    strict: bool = False,
    progress: Progress | None = None,
) -> RekeyReport:
    """`rekey` for the async stores (`AsyncSqliteCheckpointStore`, `AsyncPostgresCheckpointStore`,
    `AsyncRedisCheckpointStore`, `AsyncDurableObjectCheckpointStore`: on WebCrypto too), the runtimes (`SqliteRuntime`, `PostgresRuntime`: their checkpoint
    rows, and the journal's sealed rows) and the endpoint's event logs (`SqliteEventLog`,
    `PostgresEventLog`: run meta and event data); a synchronous store's batches run on the calling thread."""
    rekeyer = Rekeyer(keyring, strict=strict)
    return await _rekeying(_step(target, batch_size), rekeyer, batch_size, progress)


__all__ = ["DEFAULT_BATCH_SIZE", "RekeyReport", "Rekeyable", "Rekeyer", "rekey", "rekey_async"]
