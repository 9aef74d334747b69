"""`SqlRuntime`: what the SQLite and Postgres runtimes share — the journal's rows over a `SqlExecutor`.

The rows are read and written by the plans of `durable_agent.backends._sql.journal` (no I/O); an executor
runs each plan in one transaction, rolled back when the plan raises. The rules over the rows
(leases, submissions, the run's steps) are the memory runtime's too: `runtime.stored`,
`runtime.scope`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import Any, Protocol

from ..._checkpoint import AgentCheckpoint
from ..._errors import CheckpointCorruptError, StaleEpochError
from ..._storage.history import PrefixCache
from ..._storage.leases import Fences
from ..._storage.records import AwakeableRecord, LeaseRow, RunTransition, StepRecord, StreamPartialRecord
from ..._storage.sealing import DAMAGE, RowSealer
from ..._storage.stored import StoredRuntime
from ..._storage.validate import check_checkpoint, check_expected, check_run_id
from ...encryption._rekey import Rekeyer, RekeyReport
from . import journal as plans
from .checkpoints import SEALED_COLUMNS as CHECKPOINT_COLUMNS, load_plan, remembered, save_plan
from .plan import Dialect, Mergeable, Plan, T
from .rekey import Position, rekey_plan

SEALED_COLUMNS = (*CHECKPOINT_COLUMNS, *plans.SEALED_COLUMNS)  # every sealed column of a runtime's database, walked by `rekey_async(runtime)`


class SqlExecutor(Protocol):
    """Runs plans on one database: each plan in one transaction, rolled back when the plan raises."""

    dialect: Dialect

    def run(self, plan: Plan[T], *, write: bool, merge: Mergeable | None = None,
            snapshot: bool = False) -> Awaitable[T]:
        """`plan`'s result; `merge`: the same write, for an executor that runs writes of its kind together
        (or ignores it); `snapshot`: a read of several statements that must see one state of the database
        (a checkpoint's header and its message rows). An awaitable, not necessarily a coroutine: an
        executor may hand back the future its writer settles (one frame less on every write of a busy loop)."""

    async def wait_for_change(self, timeout: float) -> None: ...


class SqlRows:
    """`RuntimeRows` over a `SqlExecutor`; a refused fenced write also tells the runtime's `Fences`.

    Every read goes through `read` and every write through `write` (one transaction each),
    the seams a test or a bench wraps to count or interrupt writes.
    """

    def __init__(self, executor: SqlExecutor, fences: Fences, cache: PrefixCache, sealer: RowSealer) -> None:
        self._executor = executor
        self._d = executor.dialect
        self._fences = fences
        self.cache = cache  # what this "process" last wrote or read of each run's checkpoint
        self._sealer = sealer  # every payload column and checkpoint row passes through it (`journal.PLACES`)

    async def read(self, plan: Plan[T], *, snapshot: bool = False) -> T:
        return await self._executor.run(plan, write=False, snapshot=snapshot)

    async def write(self, plan: Plan[T], merge: Mergeable | None = None) -> T:
        try:
            return await self._executor.run(plan, write=True, merge=merge)
        except StaleEpochError as error:
            self._fences.refused(error)
            raise

    async def get_step(self, session_id: str, key: str) -> StepRecord | None:
        return await self.read(plans.get_step_plan(session_id, key, self._sealer))

    async def put_steps(
        self, records: Sequence[StepRecord], *, epoch: int | None, streamed: Collection[str] | None = None
    ) -> None:
        await self.write(plans.put_steps_plan(self._d, records, epoch, streamed, self._sealer),
                         plans.mergeable_steps(self._d, records, epoch, streamed, self._sealer))

    async def run_steps(self, session_id: str, run_id: str) -> list[StepRecord]:
        return await self.read(plans.steps_plan(session_id, run_id, self._sealer))

    async def add_partial(self, record: StreamPartialRecord, *, epoch: int | None) -> None:
        await self.write(plans.add_partial_plan(self._d, record, epoch, self._sealer))

    async def run_partials(self, session_id: str, run_id: str) -> list[StreamPartialRecord]:
        return await self.read(plans.partials_plan(session_id, run_id, self._sealer))

    async def awakeable_for(
        self, session_id: str, key: str, new_id: str, deadline: int | None, *, epoch: int | None
    ) -> AwakeableRecord:
        return await self.write(plans.awakeable_for_plan(self._d, session_id, key, new_id, deadline, epoch,
                                                                self._sealer))

    async def get_awakeable(self, awakeable_id: str) -> AwakeableRecord | None:
        return await self.read(plans.get_awakeable_plan(awakeable_id, self._sealer))

    async def wait_for_change(self, timeout: float) -> None:
        await self._executor.wait_for_change(timeout)

    async def lease_row(self, session_id: str) -> LeaseRow | None:
        return await self.read(plans.lease_row_plan(session_id))

    async def change_lease(
        self, session_id: str, change: Callable[[LeaseRow], LeaseRow | None], *, epoch: int | None = None
    ) -> tuple[LeaseRow, bool]:
        return await self.write(plans.change_lease_plan(self._d, session_id, change, epoch))

    async def marked_leases(self, session_id: str | None) -> list[tuple[str, LeaseRow, list[str]]]:
        return await self.read(plans.marked_leases_plan(session_id))

    async def queue(self, session_id: str) -> list[Any]:
        return await self.read(plans.queue_read_plan(session_id, self._sealer))

    async def put_queue(self, session_id: str, entries: list[Any], *, epoch: int | None) -> None:
        await self.write(plans.queue_write_plan(self._d, session_id, entries, epoch, self._sealer))

    async def add_submission(self, session_id: str, request_id: str, fingerprint: str) -> tuple[str, Any] | None:
        return await self.write(plans.add_submission_plan(session_id, request_id, fingerprint, self._sealer))

    async def complete_submission(self, session_id: str, request_id: str, result: Any) -> None:
        await self.write(plans.complete_submission_plan(session_id, request_id, result, self._sealer))

    async def tool_state(self, session_id: str, key: str | None) -> dict[str, Any]:
        return await self.read(plans.tool_state_plan(session_id, key, self._sealer))

    async def last_run(self, session_id: str) -> str | None:
        return await self.read(plans.last_run_plan(session_id))

    async def put_last_run(self, session_id: str, run_id: str, *, epoch: int | None) -> None:
        await self.write(plans.set_last_run_plan(self._d, session_id, run_id, epoch))

    async def steps(self, run_id: str | None) -> list[StepRecord]:
        return await self.read(plans.steps_plan(None, run_id, self._sealer))

    async def partials(self, run_id: str | None) -> list[StreamPartialRecord]:
        return await self.read(plans.partials_plan(None, run_id, self._sealer))

    async def awakeables(self) -> list[AwakeableRecord]:
        return await self.read(plans.awakeables_plan(self._sealer))

    async def find_awakeable(self, session_id: str, key: str) -> AwakeableRecord | None:
        return await self.read(plans.find_awakeable_plan(session_id, key, self._sealer))

    async def resolve_awakeable(self, awakeable_id: str, value: Any) -> bool:
        return await self.write(plans.resolve_awakeable_plan(self._d, awakeable_id, value, self._sealer))

    async def commit(self, transition: RunTransition) -> None:
        """Apply `transition` in one transaction with the lease's epoch checked inside it."""
        checkpoint = transition.checkpoint
        if checkpoint is not None:
            check_checkpoint(checkpoint)
        try:
            revision = await self.write(plans.commit_plan(self._d, transition, self.cache, self._sealer),
                                        plans.mergeable_commit(self._d, transition, self.cache, self._sealer))
        except BaseException:
            if checkpoint is not None:
                self.cache.forget(checkpoint.run_id)  # unknown outcome: the next save re-reads
            raise
        if checkpoint is not None and revision is not None:  # a checkpoint's save returns its revision
            self.cache.remember(checkpoint.run_id, revision, checkpoint.messages, holder=transition.session_id)

    async def load_checkpoint(self, run_id: str) -> AgentCheckpoint | None:
        with self.cache.forgetting(run_id, DAMAGE):  # damaged rows: the next save re-reads them, not appends
            try:
                found = await self.read(load_plan(run_id, self._sealer), snapshot=True)  # header and rows agree
            except DAMAGE:
                raise
            except Exception as exc:
                if "decode" in str(exc):  # SQLite text that is not UTF-8: a damaged row
                    raise CheckpointCorruptError(f"stored text is not UTF-8 ({exc})", run_id=run_id) from None
                raise
        return remembered(self.cache, run_id, found)

    async def save_checkpoint(self, checkpoint: AgentCheckpoint, expected_step_index: int | None) -> None:
        try:
            revision = await self.write(save_plan(self.cache, checkpoint, expected_step_index, self._d,
                                                  sealer=self._sealer))
        except BaseException:
            self.cache.forget(checkpoint.run_id)
            raise
        self.cache.remember(checkpoint.run_id, revision, checkpoint.messages)


class SqlCheckpoints:
    """The runtime's checkpoints, read through its own connection (off the event loop's thread on SQLite).

    The runtime writes them itself, fenced, in its lifecycle commits (`SqlRuntime.commit`);
    `save` here is the plain, unfenced store save (with the optional `expected_step_index` guard).
    """

    def __init__(self, rows: SqlRows) -> None:
        self._rows = rows

    async def load(self, run_id: str) -> AgentCheckpoint | None:
        return await self._rows.load_checkpoint(check_run_id(run_id))

    async def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        await self._rows.save_checkpoint(check_checkpoint(checkpoint), check_expected(expected_step_index))


class SqlRuntime(StoredRuntime[SqlCheckpoints]):
    """A checkpoint-mode `DurableRuntime` over a `SqlExecutor`: what the SQLite and Postgres runtimes share.

    One instance is one "process": its own owner token and fences. Several instances (in
    one process or many) over one database are several processes on that database.
    `sealer`: the runtime's `encryption` option as a `RowSealer` (`row_sealer`): it builds every payload
    column of the journal and every checkpoint row.
    """

    backend: SqlRows

    def __init__(self, executor: SqlExecutor, *, clock: Callable[[], int], sealer: RowSealer) -> None:
        fences = Fences()
        self._dialect = executor.dialect
        rows = SqlRows(executor, fences, PrefixCache(), sealer)
        super().__init__(rows, SqlCheckpoints(rows), fences, clock)

    async def _rekey_batch(self, rekeyer: Rekeyer, position: Position, batch_size: int) -> tuple[RekeyReport, Position]:
        """One batch of `durable_agent.encryption.rekey_async`, in one write transaction (`rekey_plan`)."""
        return await self.backend.write(rekey_plan(SEALED_COLUMNS, self._dialect, rekeyer, position, batch_size))

    def lease_released(self, session_id: str, epoch: int) -> None:
        """Also forget the runs saved under the lease: the checkpoint cache holds each run while it is live."""
        if self.fences.epoch(session_id) == epoch:
            self.backend.cache.release(session_id)
        super().lease_released(session_id, epoch)
