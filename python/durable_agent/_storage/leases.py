"""The lease rules, written once for every runtime (memory, SQLite, Postgres).

A runtime stores a `LeaseRow` per session however it likes; whether a claim succeeds,
whether a lease lapsed and whether a run is listed as resumable is decided here, from the
row and the clock, so the three runtimes cannot drift apart:

* a lease **lapsed** when it was released, when its owner is known dead (same host, no such
  pid), or when it was last renewed at or before ``stale_at`` by an owner that no longer
  holds it (a quiet owner on this host whose process still runs keeps it for up to
  `RUN_OWNER_HOLD_MS`: a busy event loop is not a dead process);
* a claim succeeds on a lapsed lease, or on one held under the claimer's own owner token
  (a process re-claiming its own session); every successful claim bumps the epoch;
* but a runtime never claims a session it holds **live** (claimed and not released yet,
  or a claim of it in flight: `Fences.hold`): the second claim is refused, naming the
  holder, so two concurrent runs of one session through one runtime cannot fence each other
  (a server answering two requests for one session, ``gather(agent.run(a), agent.run(b))``).
  A release always ends the live hold, even when its write failed (the run that raised
  released in its ``finally``); so the own-token rule only re-claims a lease this runtime
  holds no run of any more: after a release that did not land, or for a process that reuses
  its owner token;
* a run is **resumable** when the session was leased at least once, the run is still marked
  in progress, the lease lapsed, and the run is not parked on an unresolved awakeable;
* a holder **trusts** its lease for half the staleness its claim judged by (``now - stale_at``,
  the rule it took the lease under, which it expects of its successor), counted from when it
  sent its last claim or renewal that succeeded (monotonic time: a blocked event loop, a GC
  pause or a stopped process count). Past that, before a step runs (a model call, a tool) the
  run's scope renews the lease, fenced: refused means another process took the run over, and
  the step does not run (`StaleEpochError`). A fenced write that lands confirms nothing for
  later: it leaves ``renewed_at`` as it was, so the lease may lapse right after it.

`Fences` is the per-runtime ("per-process") half: which sessions this runtime holds live,
which epoch its writes of each are guarded by, when it last confirmed each, and whom to tell
when one is refused.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable, Iterable
from typing import Literal

from .._errors import StaleEpochError
from .keys import run_key_prefix
from .records import LeaseRow, RunOwner

RUN_OWNER_HOLD_MS = 30_000
"""How long a quiet owner on this host that still runs keeps its lease past staleness."""


def new_owner() -> RunOwner:
    """An owner naming this process, with a token unique to the runtime that asks."""
    return RunOwner(socket.gethostname(), os.getpid(), uuid.uuid4().hex)


class OwnedRuntime:
    """Base of the runtimes: the lease owner naming this runtime, minted on first use.

    Minting takes entropy (a uuid4 token), which Cloudflare Workers forbid outside a request:
    a runtime built at module scope must not touch it until a run claims a lease.
    """

    _owner: RunOwner | None = None
    # Declared here so a subclass's `mode = "checkpoint"` keeps the Literal type `DurableRuntime` asks for.
    mode: Literal["checkpoint", "replay"]

    @property
    def owner(self) -> RunOwner:
        if self._owner is None:
            self._owner = new_owner()
        return self._owner

    @owner.setter
    def owner(self, value: RunOwner) -> None:
        self._owner = value


def is_run_owner_dead(owner: RunOwner | None) -> bool:
    """True when `owner` ran on this host and its process is gone. Unknown hosts are never known dead."""
    if owner is None or owner.host != socket.gethostname():
        return False
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return True
    except (PermissionError, OSError, AttributeError):  # AttributeError: no os.kill (Pyodide)
        return False
    return False


def is_run_owner_holding(owner: RunOwner | None, renewed_at: int, now: int) -> bool:
    """True when `owner` is a live process on this host that renewed within `RUN_OWNER_HOLD_MS`."""
    if owner is None or owner.host != socket.gethostname() or is_run_owner_dead(owner):
        return False
    return now - renewed_at < RUN_OWNER_HOLD_MS


def lease_lapsed(row: LeaseRow, *, stale_at: int, now: int) -> bool:
    """True when no live owner holds `row` any more (see the module docs)."""
    return (
        row.released
        or is_run_owner_dead(row.owner)
        or (row.renewed_at <= stale_at and not is_run_owner_holding(row.owner, row.renewed_at, now))
    )


def may_claim(row: LeaseRow, claimer: RunOwner, *, stale_at: int, now: int) -> bool:
    """True when `claimer` may take `row`: it lapsed, or `claimer` holds it under its own token."""
    own = row.owner is not None and row.owner.token == claimer.token
    return own or lease_lapsed(row, stale_at=stale_at, now=now)


def claimed_row(row: LeaseRow, claimer: RunOwner, now: int) -> LeaseRow:
    """The row after a successful claim: the next epoch, held by `claimer`, renewed now."""
    return LeaseRow(
        epoch=row.epoch + 1, owner=claimer, renewed_at=now, released=False, resumable_run=row.resumable_run
    )


def trusted_until(sent_at: float, stale_after_ms: int) -> float:
    """Until when (monotonic seconds) a lease is trusted after a claim or renewal of it sent at `sent_at` landed."""
    return sent_at + stale_after_ms / 2000


def is_listed_resumable(
    row: LeaseRow, unresolved_awakeable_keys: Iterable[str], *, stale_at: int, now: int
) -> bool:
    """True when the run marked on `row` is to be resumed (see the module docs).

    `unresolved_awakeable_keys`: keys of the session's unresolved awakeables.
    """
    if row.resumable_run is None or row.epoch == 0 or not lease_lapsed(row, stale_at=stale_at, now=now):
        return False
    prefix = run_key_prefix(row.resumable_run)
    return not any(key.startswith(prefix) for key in unresolved_awakeable_keys)


class Fences:
    """One runtime's claims: the sessions it holds live, the epoch each one's writes are guarded by, when
    each was last confirmed, who hears of a refusal.

    A claim holds the session from before its write (`hold`) until it fails (`unheld`) or
    until `release` of the epoch it took; a scope opened without an explicit epoch is
    guarded by the held one. Holding is synchronous, so two claims of one runtime racing
    for a session cannot both pass it, whatever order their writes commit in.
    """

    def __init__(self) -> None:
        self._holders: dict[str, RunOwner] = {}
        self._epochs: dict[str, int] = {}
        self._listeners: dict[str, Callable[[StaleEpochError], None]] = {}
        self._trusted: dict[str, tuple[int, float, int]] = {}  # epoch, trusted until (monotonic), staleness

    def hold(self, session_id: str, claimer: RunOwner) -> RunOwner | None:
        """Hold `session_id` for a claim by `claimer`; None when held now, else the owner holding it live already."""
        holder = self._holders.get(session_id)
        if holder is None:
            self._holders[session_id] = claimer
        return holder

    def unheld(self, session_id: str) -> None:
        """The claim `hold` was for did not take the lease: the session is free again on this runtime."""
        if session_id not in self._epochs:
            self._holders.pop(session_id, None)

    def claimed(
        self, session_id: str, epoch: int, on_stale: Callable[[StaleEpochError], None] | None,
        *, sent_at: float, stale_after_ms: int,
    ) -> None:
        """The claim sent at `sent_at` (monotonic) took the lease at `epoch`, judging by `stale_after_ms`."""
        self._epochs[session_id] = epoch
        self._trusted[session_id] = (epoch, trusted_until(sent_at, stale_after_ms), stale_after_ms)
        if on_stale is not None:
            self._listeners[session_id] = on_stale

    def renewed(self, session_id: str, epoch: int, sent_at: float) -> None:
        """A renewal of `epoch` sent at `sent_at` (monotonic) landed: the lease is trusted anew from then on."""
        trusted = self._trusted.get(session_id)
        if trusted is not None and trusted[0] == epoch:
            until = trusted_until(sent_at, trusted[2])
            if until > trusted[1]:  # renewals may land out of the order they were sent in
                self._trusted[session_id] = (epoch, until, trusted[2])

    def trusted(self, session_id: str, epoch: int, now: float) -> bool:
        """True when this runtime's lease of the session at `epoch` is trusted at `now` (module docs)."""
        trusted = self._trusted.get(session_id)
        return trusted is not None and trusted[0] == epoch and now < trusted[1]

    def released(self, session_id: str, epoch: int) -> None:
        if self._epochs.get(session_id) == epoch:
            del self._epochs[session_id]
            self._holders.pop(session_id, None)
            self._listeners.pop(session_id, None)
            self._trusted.pop(session_id, None)

    def epoch(self, session_id: str) -> int | None:
        return self._epochs.get(session_id)

    def refused(self, error: StaleEpochError) -> None:
        """Tell the session's `on_stale` listener (if any) that a write guarded by `error.epoch` was refused."""
        listener = self._listeners.get(error.session_id)
        if listener is not None:
            listener(error)
