"""The per-run step log: what a store keeps so a run can be read back, and forked, at any step boundary.

A checkpoint is the *latest* state of a run. To read the state at an earlier boundary, a store
keeps, per run and step index, the header saved at that step and the length of the history
then; the messages are the run's stored ones (history is append-only, so the first `count`
stored messages are the history at that step). Two rules keep every entry true to what was
saved at its step:

* a save at step `s` removes the entries after `s`: they belong to a timeline that was
  replaced (a step run again after a crash, an edit saved at an earlier step);
* a save that rewrote the stored messages from position `k` on removes the entries whose
  history was longer than `k`: their messages are gone.

By induction the entries stay ordered by step with non-decreasing counts, so both rules pop
from the end: a save costs O(1) amortized, whatever the length of the run.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any, Generic, TypeVar

from .._messages import built_from

H = TypeVar("H")


class StepLog(Generic[H]):
    """Per run: ``(step_index, message_count, header)`` entries, ordered by step index."""

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[int, int, H]] = []

    def record(self, step_index: int, count: int, kept: int, header: H) -> None:
        """A save at `step_index` whose history has `count` messages, the first `kept` of them
        already stored before this save (unchanged)."""
        entries = self._entries
        while entries and (entries[-1][0] >= step_index or entries[-1][1] > kept):
            entries.pop()
        entries.append((step_index, count, header))

    def at(self, step_index: int) -> tuple[int, H] | None:
        """``(message_count, header)`` saved at `step_index`, or None when the log holds no such step."""
        entries = self._entries
        i = bisect_left(entries, step_index, key=lambda e: e[0])
        if i < len(entries) and entries[i][0] == step_index:
            return entries[i][1], entries[i][2]
        return None

    def steps(self) -> list[int]:
        """The step indices the log holds, ascending."""
        return [e[0] for e in self._entries]


def common_prefix(old: Sequence[Any], new: Sequence[Any]) -> int:
    """How many leading messages `new` shares with `old` (the same object, or equal).

    When `new` was built by appending to `old` (`_messages.built_from` proves it: the loop's case) this
    is O(1); when it holds the same message objects otherwise, the C-speed list comparison of
    pointers (about 20 µs for 2,000 messages), the same checks the persistent stores make
    (`_history.PrefixCache`). A rewritten history is compared message by message.
    """
    n = len(old)
    if n and len(new) >= n and new[n - 1] is old[n - 1]:
        if built_from(new, old):
            return n  # the loop built `new` by appending to `old` (`messages.History`): O(1)
        head = new[:n]
        if head == old if type(head) is type(old) else list(head) == list(old):
            return n
    limit = min(n, len(new))
    for i in range(limit):
        if new[i] is not old[i] and new[i] != old[i]:
            return i
    return limit
