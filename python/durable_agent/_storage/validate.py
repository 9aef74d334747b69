"""Argument checks shared by every store, so each backend rejects bad input the same way."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

from .._checkpoint import RUN_STATUSES, AgentCheckpoint, RunStatus
from .._errors import ConfigurationError

logger = logging.getLogger("durable_agent")


def check_checkpoint(checkpoint: Any) -> AgentCheckpoint:
    """`checkpoint` itself, after checking it is an `AgentCheckpoint` with a storable run id."""
    if not isinstance(checkpoint, AgentCheckpoint):
        raise ConfigurationError(f"save() needs an AgentCheckpoint, got {type(checkpoint).__name__}")
    check_run_id(checkpoint.run_id)
    return checkpoint


MAX_RUN_ID_BYTES = 1024
"""The longest run id, in UTF-8 bytes, every backend stores.

Postgres refuses b-tree index entries over about 2,700 bytes (the run id is in three
indexes); a Durable Object key holds the store's prefix and the run id within its limit.
"""


def check_run_id(run_id: Any, what: str = "run_id") -> str:
    """A run id every backend can store: a non-empty str of valid Unicode without NUL, at most
    `MAX_RUN_ID_BYTES` UTF-8 bytes.

    NUL is refused because Postgres text cannot hold it; lone surrogates because they have
    no UTF-8 form. Checking here keeps every backend (memory included) accepting the same ids.
    `what` names the argument in the error (`list(after=)` is checked the same way).
    """
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError(f"{what} must be a non-empty str, got {run_id!r}")
    if "\x00" in run_id:
        raise ConfigurationError(f"{what} must not contain NUL, got {run_id!r}")
    try:
        size = len(run_id.encode("utf-8"))
    except UnicodeEncodeError:
        raise ConfigurationError(f"{what} must be valid Unicode (no lone surrogates), got {run_id!r}") from None
    if size > MAX_RUN_ID_BYTES:
        raise ConfigurationError(
            f"{what} is {size} UTF-8 bytes, more than the {MAX_RUN_ID_BYTES} every store accepts: {run_id[:40]!r}..."
        )
    return run_id


def check_expected(expected_step_index: Any) -> int | None:
    if expected_step_index is None:
        return None
    if type(expected_step_index) is not int or expected_step_index < 0:
        raise ConfigurationError(
            f"expected_step_index must be None or a non-negative int, got {expected_step_index!r}"
        )
    return expected_step_index


def check_step_index(step_index: Any) -> int:
    if type(step_index) is not int or step_index < 0:
        raise ConfigurationError(f"a step index is a non-negative int, got {step_index!r}")
    return step_index


def check_status(status: object) -> RunStatus | None:
    if status is None:
        return None
    for known in RUN_STATUSES:
        if status == known:
            return known
    raise ConfigurationError(f"status must be None or one of {RUN_STATUSES}, got {status!r}")


def check_list_args(status: Any, limit: Any, after: Any) -> tuple[RunStatus | None, int | None, str | None]:
    """Checked `list(status=, limit=, after=)` arguments."""
    if limit is not None and (type(limit) is not int or limit < 1):
        raise ConfigurationError(f"limit must be None or a positive int, got {limit!r}")
    if after is not None:
        check_run_id(after, "after")
    return check_status(status), limit, after


def check_prune_args(before: Any, status: Any, include_suspended: Any) -> tuple[int, RunStatus | None, bool]:
    """Checked `prune(before=, status=, include_suspended=)` arguments.

    Suspended runs wait for a human; pruning them must be asked for with
    `include_suspended=True`, so `status="suspended"` alone is refused rather than ignored.
    """
    if type(before) is not int:
        raise ConfigurationError(f"before must be an int (epoch ms), got {before!r}")
    if type(include_suspended) is not bool:
        raise ConfigurationError(f"include_suspended must be a bool, got {include_suspended!r}")
    checked = check_status(status)
    if checked == "suspended" and not include_suspended:
        raise ConfigurationError(
            "prune(status='suspended') would delete runs awaiting approval: pass include_suspended=True"
        )
    return before, checked, include_suspended


def prunable(
    status: str, created_at: int, before: int, only: RunStatus | None, include_suspended: bool
) -> bool:
    """Whether a run with this latest `status`/`created_at` is deleted by `prune`."""
    if created_at >= before:
        return False
    if status == "suspended" and not include_suspended:
        return False
    return only is None or status == only


def page(run_ids: Any, limit: int | None, after: str | None) -> list[str]:
    """Sorted run ids strictly after `after`, at most `limit` of them (keyset paging)."""
    ordered = sorted(r for r in run_ids if after is None or r > after)
    return ordered if limit is None else ordered[:limit]


def readable_id(run_id: Any) -> str | None:
    """A stored run id as str (bytes decoded as UTF-8), or None, logged, when it is unreadable.

    `list` and `prune` skip such an id rather than fail for every run: a damaged index entry
    stays the problem of the run it belonged to.
    """
    if isinstance(run_id, bytes):
        try:
            return run_id.decode("utf-8")
        except UnicodeDecodeError:
            pass
    elif isinstance(run_id, str):
        return run_id
    logger.warning("checkpoint store: skipping the unreadable run id %r (a damaged index entry)", run_id)
    return None


def readable_ids(run_ids: Iterable[Any]) -> list[str]:
    """The readable ids of `run_ids`, in order (see `readable_id`)."""
    return [r for r in map(readable_id, run_ids) if r is not None]
