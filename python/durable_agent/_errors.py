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


class StepNotFoundError(DurableAgentError, LookupError):
    """The store holds no record of a run's state at that step boundary (see `durable_agent._fork`)."""

    code = "step_not_found"

    def __init__(self, run_id: str, step_index: int, why: str) -> None:
        super().__init__(f"run {run_id!r} has no stored state at step {step_index}: {why}")
        self.run_id = run_id
        self.step_index = step_index


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

    def __init__(self, run_id: str, expected: int | None, actual: int | None, message: str | None = None) -> None:
        super().__init__(
            message
            or f"run {run_id!r}: expected the stored checkpoint at step {expected!r}, found {actual!r}; "
            "another writer saved this run"
        )
        self.run_id = run_id
        self.expected = expected
        self.actual = actual


class ConfigurationError(DurableAgentError, ValueError):
    """An option passed to durable-agent is invalid (wrong type, out of range, unknown name)."""

    code = "configuration_error"


class RunExistsError(ConfigurationError):
    """`Agent.run(..., run_id=)` named a run that already exists: a run id names one run.

    Passing one run id per piece of work makes starting it idempotent: a retry after a crash
    gets this error (the run was started; with ``on_interrupted="resume"`` it was also
    finished first) instead of a second run on the same prompt. `generate_text` and
    `stream_chat` raise it too for a stored `run_id` whose history their `messages` do not
    begin with (a call that begins with it continues the run: its next leg).
    """

    code = "run_exists"

    def __init__(self, run_id: str, detail: str = "a run id names one run") -> None:
        super().__init__(f"run id {run_id!r} already names a stored run; {detail}")
        self.run_id = run_id


class RunAbortedError(DurableAgentError, RuntimeError):
    """The caller aborted the run through its `signal`; the interrupted step was not checkpointed."""

    durable_control = True
    code = "run_aborted"

    def __init__(self, run_id: str | None = None) -> None:
        super().__init__("the run was aborted" + (f" (run {run_id!r})" if run_id else ""))
        self.run_id = run_id


class FeatureUnavailableError(DurableAgentError, RuntimeError):
    """A feature needs a module this Python runtime lacks (sqlite3 on Pyodide 0.28, a driver not installed)."""

    code = "feature_unavailable"


class ApprovalSigningError(DurableAgentError, ValueError):
    """An approval request cannot be signed: a malformed request, or a token longer than the signer accepts."""

    code = "approval_signing"


class DecryptionError(DurableAgentError, ValueError):
    """A stored value cannot be decrypted (see `durable_agent.encryption`): not an envelope, sealed with a key
    the keyring does not hold, or not authentic (another key, another place, an altered or truncated value).

    The message names the place the caller read it from (`place`, e.g. ``("checkpoint-message", run_id,
    seq)``) and the `problem`; it never holds a key nor any of the plaintext.
    """

    code = "decryption_failed"

    def __init__(self, place: tuple[str | int, ...], problem: str) -> None:
        super().__init__(f"cannot decrypt the value stored at {place!r}: {problem}")
        self.place = place
        self.problem = problem


class StepKeyError(DurableAgentError, ValueError):
    """A step key, or one of its parts, is malformed."""

    code = "step_key_invalid"


RUN_TAKEN_OVER_MESSAGE = "this run continued in another process"


class StaleEpochError(DurableAgentError, RuntimeError):
    """A write guarded by a lease epoch was refused: another process claimed the run since.

    The run stops at once, with no final save.
    """

    durable_control = True
    code = "stale_epoch"

    def __init__(self, session_id: str, epoch: int) -> None:
        super().__init__(f"{RUN_TAKEN_OVER_MESSAGE} (session {session_id!r}, epoch {epoch} is stale)")
        self.session_id = session_id
        self.epoch = epoch


class RunLeaseHeldError(DurableAgentError, RuntimeError):
    """A run could not start: another live process holds its session's lease (`owner`, when known)."""

    code = "run_lease_held"

    def __init__(self, session_id: str, owner: object | None = None) -> None:
        holder = f" by {owner}" if owner is not None else ""
        super().__init__(f"session {session_id!r} is held{holder}")
        self.session_id = session_id
        self.owner = owner


class RunSuspendedError(DurableAgentError, RuntimeError):
    """`Agent.suspend()` stopped the run; it stays resumable from its last committed step. A control error."""

    durable_control = True
    code = "run_suspended"

    def __init__(self) -> None:
        super().__init__("the run was suspended; resume it to continue")


class OutputValidationError(DurableAgentError, ValueError):
    """The final answer did not match `output=` even after the repairs `output_retries` allows."""

    code = "output_invalid"

    def __init__(self, problem: str, text: str) -> None:
        super().__init__(f"the final answer does not match the required output: {problem}")
        self.problem = problem
        self.text = text


class SessionStateError(DurableAgentError, RuntimeError):
    """A session's stored state cannot be continued (e.g. a run marked in progress has no checkpoint).

    Nothing is changed or dropped: the message names the session, the run and the way out,
    `Agent.abandon_interrupted()`, which unmarks the run so the session's next run can start.
    """

    code = "session_state"

    def __init__(self, session_id: str, run_id: str, problem: str) -> None:
        super().__init__(
            f"session {session_id!r}: run {run_id!r} {problem}; it cannot be continued. Inspect it, then call "
            "Agent.abandon_interrupted() to unmark it (its stored data is kept) and start the next run"
        )
        self.session_id = session_id
        self.run_id = run_id


class ScopeClosedError(DurableAgentError, RuntimeError):
    """A step was asked of a run scope that was already closed."""

    code = "scope_closed"


class StepFailedError(DurableAgentError, RuntimeError):
    """A step's failure rebuilt from its record: the original error's class name, message and fields.

    `error_code` is the original error's own code (a provider's ``rate_limited``);
    `durable_decision` is the loop's stored verdict on the failure (retry, give up, ...).
    """

    code = "step_failed"

    def __init__(
        self,
        name: str,
        message: str,
        *,
        error_code: str | None = None,
        status: int | None = None,
        retryable: bool | None = None,
        data: object = None,
        durable_decision: object = None,
    ) -> None:
        super().__init__(message)
        self.name = name
        self.error_code = error_code
        self.status = status
        self.retryable = retryable
        self.data = data
        self.durable_decision = durable_decision


class SubmissionConflictError(DurableAgentError, ValueError):
    """A send reused a request id with a different input; the first send's id cannot be taken over."""

    code = "submission_conflict"

    def __init__(self, session_id: str, request_id: str) -> None:
        super().__init__(f"request id {request_id!r} of session {session_id!r} was already used for another input")
        self.session_id = session_id
        self.request_id = request_id


class MCPServerError(DurableAgentError, ConnectionError):
    """An MCP server could not be used: its command does not start, it never answered `initialize`
    in time, or it went away (during a call too). `server` names the command or URL.

    A control error: a run it stops is left as a process death leaves it (an unsafe call in
    flight is reported interrupted on resume, a safe one runs again), so resuming it, which
    reconnects, is the way on.
    """

    durable_control = True
    code = "mcp_server"

    def __init__(self, server: str, problem: str, *, stderr: str = "") -> None:
        """`stderr`: the end of a stdio server's stderr (its last 2 KB: a Python server's traceback, say)."""
        super().__init__(f"MCP server {server}: {problem}" + (f"; its stderr ends with:\n{stderr}" if stderr else ""))
        self.server = server
        self.problem = problem
        self.stderr = stderr


def is_control_error(error: BaseException) -> bool:
    """True for the errors that stop or suspend a run (abort, suspension, takeover, a sub-agent's suspension).

    The loop re-raises them untouched instead of reporting a failed call, and a run scope
    never records them as a step's failure. Any exception class may opt in with a class
    attribute ``durable_control = True``.
    """
    return getattr(error, "durable_control", False) is True


class ModelCallError(DurableAgentError, RuntimeError):
    """A call to a model provider failed: the facts a retry policy decides on, as data.

    `kind` is durable-agent's classification (``rate_limited``, ``overloaded``,
    ``server_error``, ``timeout``, ``connection``, ``stream_cut``, ``malformed_chunk``,
    ``auth``, ``permission``, ``bad_request``, ``not_found``, ``context_length``, ...);
    `error_code` is the provider's own code or type when it sent one (``rate_limit_exceeded``,
    ``overloaded_error``). `retryable` says whether the same request may succeed later;
    `retry_after_ms` is how long the provider asked to wait (None when it did not say).
    `data` is what a durable runtime stores with the failed step.
    """

    code = "model_call_failed"

    def __init__(
        self,
        message: str,
        *,
        provider: str,
        kind: str,
        retryable: bool,
        status: int | None = None,
        error_code: str | None = None,
        retry_after_ms: int | None = None,
        context_exceeded: bool = False,
        request_id: str | None = None,
    ) -> None:
        super().__init__(message)
        self.provider = provider
        self.kind = kind
        self.retryable = retryable
        self.status = status
        self.error_code = error_code
        self.retry_after_ms = retry_after_ms
        self.context_exceeded = context_exceeded
        self.request_id = request_id

    @property
    def data(self) -> dict[str, object]:
        return {
            "provider": self.provider,
            "kind": self.kind,
            "error_code": self.error_code,
            "retry_after_ms": self.retry_after_ms,
            "context_exceeded": self.context_exceeded,
            "request_id": self.request_id,
        }
