"""Every error durable-agent raises, defined once.

One root (`DurableAgentError`); each leaf also subclasses the builtin a caller would
naturally catch (`CodecError` is a `ValueError`, `CheckpointNotFoundError` a
`LookupError`), and carries a stable machine-readable `.code`. The native extension
raises these same classes, never its own.
"""

from __future__ import annotations


class DurableAgentError(Exception):
    """Root of every error raised by durable-agent."""

    code = "durable_agent_error"


class CodecError(DurableAgentError, ValueError):
    """A value cannot be encoded, or a text cannot be decoded, by the checkpoint codec."""

    code = "codec_error"


class CheckpointNotFoundError(DurableAgentError, LookupError):
    """No checkpoint is stored for the run being resumed."""

    code = "checkpoint_not_found"

    def __init__(self, run_id: str) -> None:
        super().__init__(f"no checkpoint stored for run {run_id!r}")
        self.run_id = run_id


class CheckpointVersionError(DurableAgentError, ValueError):
    """A checkpoint was written by a newer schema than this library reads."""

    code = "checkpoint_version"

    def __init__(self, version: object, supported: int) -> None:
        super().__init__(
            f"checkpoint schema version {version!r} is newer than the supported version {supported}; "
            "upgrade durable-agent to read it"
        )
        self.version = version
        self.supported = supported


class CheckpointCorruptError(DurableAgentError, ValueError):
    """A stored checkpoint is malformed: truncated, not valid data, or fields of the wrong type."""

    code = "checkpoint_corrupt"

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        prefix = f"checkpoint of run {run_id!r} is corrupt: " if run_id is not None else "corrupt checkpoint: "
        super().__init__(prefix + message)
        self.run_id = run_id


class CheckpointConflictError(DurableAgentError, RuntimeError):
    """A save expected to follow one step index, but the store holds another (a concurrent writer)."""

    code = "checkpoint_conflict"

    def __init__(self, run_id: str, expected: int | None, actual: int | None) -> None:
        super().__init__(
            f"run {run_id!r}: expected the stored checkpoint at step {expected!r}, found {actual!r}; "
            "another writer saved this run"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class ConfigurationError(DurableAgentError, ValueError):
    """An option passed to durable-agent is invalid (wrong type, out of range, unknown name)."""

    code = "configuration_error"


class RunAbortedError(DurableAgentError, RuntimeError):
    """The caller aborted the run through its `signal`; the interrupted step was not checkpointed."""

    code = "run_aborted"

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__("the run was aborted" + (f" (run {run_id!r})" if run_id else ""))
        self.run_id = run_id


class FeatureUnavailableError(DurableAgentError, RuntimeError):
    """A feature needs a module this Python runtime lacks (sqlite3 on Pyodide 0.28, a driver not installed)."""

    code = "feature_unavailable"
