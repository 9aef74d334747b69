"""`DurableObjectSessionStore`: durable-agent checkpoints in a Durable Object's own storage.

It uses the synchronous key-value API of a SQLite-backed Durable Object (`ctx.storage.kv`:
``get(key)``, ``put(key, value)``, ``delete(key)``, ``list(prefix=, start=, ...)``), which is
what a Durable Object created with ``new_sqlite_classes`` (the default for new classes) has.
Why that API:

* It is synchronous, and a Durable Object runs one event at a time, so a read-then-write
  (the `expected_step_index` guard) can never interleave with another request to the object.
* Each call is its own transaction, and writes are durable before the object's next output
  leaves it (Cloudflare's output gate), so a checkpoint the loop saved is never lost by a
  crash that follows.
* Values up to 2 MB (key and value together) on SQLite-backed objects.

One entry per run: key ``{prefix}{run_id}``, value ``<header JSON>\\n<codec text>``, where the
codec text is exactly what `serialize_checkpoint` produced (bytes survive as ``$bytes``) and
the header repeats status, step index and creation time so `list`/`prune` never decode a whole
history. The store passes `durable_agent.testing.SessionStoreConformance`.

Pure Python, no import of the Workers runtime: `storage` is anything shaped like
`DurableObjectStorage` (the real one through Pyodide's JS bridge, or a test double).
"""

from __future__ import annotations

import builtins
import json
from typing import Any

from durable_agent import AgentCheckpoint, deserialize_checkpoint, serialize_checkpoint
from durable_agent.errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    ConfigurationError,
    DurableAgentError,
)
from durable_agent.stores._validate import (
    check_checkpoint,
    check_expected,
    check_list_args,
    check_prune_args,
    check_run_id,
    page,
    prunable,
)

# SQLite-backed Durable Objects: "Key and value combined cannot exceed 2 MB".
MAX_ENTRY_BYTES = 2 * 1024 * 1024


class CheckpointTooLargeError(DurableAgentError, ValueError):
    """A checkpoint's stored form is larger than one Durable Object storage entry may be."""

    code = "checkpoint_too_large"

    def __init__(self, run_id: str, size: int, limit: int) -> None:
        super().__init__(
            f"checkpoint of run {run_id!r} is {size} bytes stored; a Durable Object entry holds at most "
            f"{limit} (key and value). Keep large files out of the history (store them in R2 and keep a "
            "reference), or trim old messages with prepare_step."
        )
        self.run_id = run_id
        self.size = size
        self.limit = limit


def _utf8_len(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


class DurableObjectSessionStore:
    """A `SessionStore` over `ctx.storage.kv` of a SQLite-backed Durable Object.

    `storage` is the object's `ctx.storage`. Several runs may share one object (keys are
    prefixed with `prefix`); the Worker in this folder uses one object per run.
    """

    def __init__(self, storage: Any, *, prefix: str = "checkpoint:", max_entry_bytes: int = MAX_ENTRY_BYTES) -> None:
        kv = getattr(storage, "kv", None)
        if kv is None:
            raise ConfigurationError(
                "DurableObjectSessionStore needs ctx.storage of a SQLite-backed Durable Object (it uses "
                "ctx.storage.kv); declare the class under new_sqlite_classes in the migrations of wrangler.toml"
            )
        if not isinstance(prefix, str) or not prefix:
            raise ConfigurationError(f"prefix must be a non-empty str, got {prefix!r}")
        self._kv = kv
        self._prefix = prefix
        self._max = max_entry_bytes

    # -- helpers ----------------------------------------------------------------------------

    def _key(self, run_id: str) -> str:
        return self._prefix + check_run_id(run_id)

    def _split(self, key: str, value: Any) -> tuple[dict[str, Any], str]:
        run_id = key[len(self._prefix):]
        if not isinstance(value, str) or "\n" not in value:
            raise CheckpointCorruptError("the stored entry is not a header line and a checkpoint", run_id=run_id)
        head, body = value.split("\n", 1)
        try:
            header = json.loads(head)
            _ = header["s"], header["i"], header["t"]
        except (ValueError, KeyError, TypeError):
            raise CheckpointCorruptError("the header line of the stored entry is malformed", run_id=run_id) from None
        return header, body

    def _headers(self) -> builtins.list[tuple[str, dict[str, Any]]]:
        out = []
        for key, value in self._kv.list(prefix=self._prefix):
            header, _ = self._split(key, value)
            out.append((key[len(self._prefix):], header))
        return out

    # -- the SessionStore surface -----------------------------------------------------------

    def save(self, checkpoint: AgentCheckpoint, *, expected_step_index: int | None = None) -> None:
        """Store `checkpoint` as its run's latest; with `expected_step_index`, only if the stored
        checkpoint is at that step (else `CheckpointConflictError`, nothing written)."""
        checkpoint = check_checkpoint(checkpoint)
        expected = check_expected(expected_step_index)
        key = self._key(checkpoint.run_id)
        body = serialize_checkpoint(checkpoint)  # a CodecError here leaves the stored entry alone
        header = json.dumps({"s": checkpoint.status, "i": checkpoint.step_index, "t": checkpoint.created_at},
                            separators=(",", ":"))
        value = f"{header}\n{body}"
        size = _utf8_len(key) + _utf8_len(value)
        if size > self._max:
            raise CheckpointTooLargeError(checkpoint.run_id, size, self._max)
        if expected is not None:
            current = self._kv.get(key)
            actual = None if current is None else self._split(key, current)[0]["i"]
            if actual != expected:
                raise CheckpointConflictError(checkpoint.run_id, expected, actual)
        self._kv.put(key, value)

    def load(self, run_id: str) -> AgentCheckpoint | None:
        key = self._key(run_id)
        value = self._kv.get(key)
        if value is None:
            return None
        _, body = self._split(key, value)
        return deserialize_checkpoint(body)

    def delete(self, run_id: str) -> None:
        self._kv.delete(self._key(run_id))

    def list(self, *, status: str | None = None, limit: int | None = None, after: str | None = None) -> builtins.list[str]:
        """Run ids in code-point order, optionally only those whose latest status is `status`."""
        status, limit, after = check_list_args(status, limit, after)
        return page((r for r, h in self._headers() if status is None or h["s"] == status), limit, after)

    def prune(self, *, before: int, status: str | None = None, include_suspended: bool = False) -> builtins.list[str]:
        """Delete runs whose latest checkpoint was created before `before` (epoch ms); return their ids."""
        before, status, include_suspended = check_prune_args(before, status, include_suspended)
        doomed = page((r for r, h in self._headers() if prunable(h["s"], h["t"], before, status, include_suspended)),
                      None, None)
        for run_id in doomed:
            self._kv.delete(self._prefix + run_id)
        return doomed

    def close(self) -> None:
        """Nothing to release: the storage belongs to the Durable Object."""
