"""The rekey of SQL rows (`durable_agent.encryption.rekey`), written once for every SQL table that holds sealed values.

A table declares each sealed column as a `SealedColumn`: the column, the row's unique key (the
order of the walk) and how a row's place is built (`kind`, then the values of the `place`
columns). `rekey_plan` is one batch: the next `batch_size` rows of a column after the position,
each value put through `Rekeyer.rekeyed`, each rewrite an ``UPDATE ... WHERE`` key, place and old
value are still what was read (compare-and-swap: a row a live writer changed meanwhile is left as
it wrote it, and counted `changed`). The caller runs the plan in one transaction: a batch is
written whole or not at all, so a rekey killed mid-way is resumed by running it again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ...encryption._envelope import Place
from ...encryption._rekey import Rekeyer, RekeyReport
from .plan import Dialect, Plan, Query

Position = tuple[int, tuple[Any, ...] | None] | None  # (column index, last key read); None: the start


@dataclass(frozen=True, slots=True)
class SealedColumn:
    """`column` of `table` holds sealed values; `key`: the columns of the row's unique key; the place of a row's
    value is `kind` followed by the values of the `place` columns (the `key` columns when empty). `binary`:
    the column holds binary envelopes where the dialect stores them (`Dialect.binary_envelopes`), else text
    envelopes."""

    table: str
    column: str
    key: tuple[str, ...]
    kind: str
    place: tuple[str, ...] = ()
    binary: bool = False

    @property
    def identity(self) -> tuple[str, ...]:
        """The columns a rewrite checks besides the value: the key, then the place's other columns."""
        return tuple(dict.fromkeys(self.key + self.place))

    def place_of(self, row: Sequence[Any]) -> Place:
        """The place of the value in `row` (its `identity` columns, then the value)."""
        names = self.identity
        return (self.kind, *(row[names.index(name)] for name in (self.place or self.key)))


def rekey_plan(
    columns: Sequence[SealedColumn], dialect: Dialect, rekeyer: Rekeyer, position: Position, batch_size: int
) -> Plan[tuple[RekeyReport, Position]]:
    """Rekey the next batch of `columns` (walked one after the other) after `position`: its report and the
    position to go on from, None when every column is done.

    On SQLite the batch runs with ``secure_delete`` on (`Dialect.secure_delete`): the bytes of a value it
    replaces are zeroed in the file, not left in the page's free space.
    """
    if dialect.secure_delete is not None:
        yield Query(dialect.secure_delete)
    index, after = position or (0, None)
    column = columns[index]
    identity = column.identity
    keys = ", ".join(column.key)
    where = f" WHERE ({keys}) > ({', '.join('?' * len(column.key))})" if after is not None else ""
    rows = yield Query(
        f"SELECT {', '.join(identity)}, {column.column} FROM {column.table}{where} ORDER BY {keys} LIMIT ?",
        (*(after or ()), batch_size), "all",
    )
    binary = column.binary and dialect.binary_envelopes
    report, writes = rekeyer.batch([(row[-1], column.place_of(row)) for row in rows], binary=binary)
    changed = 0
    swap = (
        f"UPDATE {column.table} SET {column.column} = ? WHERE "
        + " AND ".join(f"{name} = ?" for name in (*identity, column.column))
    )
    for at, value in writes:
        changed += not (yield Query(swap, (value, *rows[at]), "count"))
    report = replace(report, rewritten=len(writes) - changed, changed=changed)
    if len(rows) == batch_size:
        return report, (index, tuple(rows[-1][: len(column.key)]))
    return report, (index + 1, None) if index + 1 < len(columns) else None
