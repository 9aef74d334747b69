"""durable-agent: durable execution for LLM agent loops.

Everything a user needs is importable from here. Importing this package uses only the
standard library and touches no entropy source (Cloudflare Workers forbid it at import).
"""

from __future__ import annotations

from ._agent import Agent, resolve_approval
from ._checkpoint import (
    CHECKPOINT_VERSION,
    AgentCheckpoint,
    ToolApprovalRequest,
    ToolApprovalResponse,
    Usage,
    deserialize_checkpoint,
    serialize_checkpoint,
)
from ._durable_session import AgentSpec, DurableOptions, DurableSession
from ._errors import (
    RUN_TAKEN_OVER_MESSAGE,
    ApprovalSigningError,
    CheckpointConflictError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CodecError,
    ConfigurationError,
    DecryptionError,
    DurableAgentError,
    FeatureUnavailableError,
    MCPServerError,
    ModelCallError,
    OutputValidationError,
    RunAbortedError,
    RunExistsError,
    RunLeaseHeldError,
    RunSuspendedError,
    SessionStateError,
    StaleEpochError,
    StepFailedError,
    StepKeyError,
    StepNotFoundError,
)
from ._fork import checkpoint_at_step, fork_run, update_run
from ._generate import (
    StreamChatResult,
    generate_text,
    resume_from_checkpoint,
    resume_stream_from_checkpoint,
    stream_chat,
)
from ._kernels import NATIVE
from ._messages import Message
from ._models import (
    LanguageModel,
    ModelRequest,
    ModelSettings,
    ReasoningEvent,
    ResponseMetadataEvent,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolSpec,
    call,
    reply,
)
from ._options import AbortSignal, PrepareStepContext, StepOverrides
from ._results import GenerateTextResult, StepResult
from ._retry import RetryPolicy
from ._signing import APPROVAL_TOKEN_DENIED_REASON, ApprovalSigner, payload_matches_call
from ._stop import ModelPrice, StopContext, cost_exceeds, step_count_is, total_tokens_exceed
from ._storage.keys import MODEL_CALL, nested_call, parse_step_key, step_key
from ._storage.protocols import CheckpointStore
from ._subagent import agent_tool
from ._tool_calls import CLIENT_TOOL_PLACEHOLDER, ToolCallContext, current_tool_call
from ._tool_functions import tool
from ._tools import Tool, ToolResult, ToolSource
from ._version import __version__
from .backends import open_store
from .backends.memory import InMemoryCheckpointStore, MemoryDurableState, MemoryRuntime
from .stream_parts import (
    StreamError,
    StreamFinish,
    StreamPart,
    StreamRefusal,
    StreamStepFinish,
    StreamStepRetry,
    StreamStepStart,
    StreamTextDelta,
    StreamToolApprovalRequest,
    StreamToolCall,
    StreamToolProgress,
    StreamToolResult,
)

__all__ = [
    "APPROVAL_TOKEN_DENIED_REASON",
    "AbortSignal",
    "Agent",
    "AgentCheckpoint",
    "AgentSpec",
    "ApprovalSigner",
    "ApprovalSigningError",
    "CHECKPOINT_VERSION",
    "CLIENT_TOOL_PLACEHOLDER",
    "CheckpointConflictError",
    "CheckpointCorruptError",
    "CheckpointNotFoundError",
    "CheckpointStore",
    "CheckpointVersionError",
    "CodecError",
    "ConfigurationError",
    "DecryptionError",
    "DurableAgentError",
    "DurableOptions",
    "DurableSession",
    "FeatureUnavailableError",
    "GenerateTextResult",
    "InMemoryCheckpointStore",
    "LanguageModel",
    "MCPServerError",
    "MODEL_CALL",
    "MemoryDurableState",
    "MemoryRuntime",
    "Message",
    "ModelCallError",
    "ModelPrice",
    "ModelRequest",
    "ModelSettings",
    "NATIVE",
    "OutputValidationError",
    "PrepareStepContext",
    "RUN_TAKEN_OVER_MESSAGE",
    "ReasoningEvent",
    "ResponseMetadataEvent",
    "RetryPolicy",
    "RunAbortedError",
    "RunExistsError",
    "RunLeaseHeldError",
    "RunSuspendedError",
    "ScriptedModel",
    "ScriptedResponse",
    "ScriptedToolCall",
    "SessionStateError",
    "StaleEpochError",
    "StepFailedError",
    "StepKeyError",
    "StepNotFoundError",
    "StepOverrides",
    "StepResult",
    "StopContext",
    "StreamChatResult",
    "StreamError",
    "StreamFinish",
    "StreamPart",
    "StreamRefusal",
    "StreamStepFinish",
    "StreamStepRetry",
    "StreamStepStart",
    "StreamTextDelta",
    "StreamToolApprovalRequest",
    "StreamToolCall",
    "StreamToolProgress",
    "StreamToolResult",
    "Tool",
    "ToolApprovalRequest",
    "ToolApprovalResponse",
    "ToolCallContext",
    "ToolResult",
    "ToolSource",
    "ToolSpec",
    "Usage",
    "__version__",
    "agent_tool",
    "call",
    "checkpoint_at_step",
    "cost_exceeds",
    "current_tool_call",
    "deserialize_checkpoint",
    "fork_run",
    "generate_text",
    "nested_call",
    "open_store",
    "parse_step_key",
    "payload_matches_call",
    "reply",
    "resolve_approval",
    "resume_from_checkpoint",
    "resume_stream_from_checkpoint",
    "serialize_checkpoint",
    "step_count_is",
    "step_key",
    "stream_chat",
    "tool",
    "total_tokens_exceed",
    "update_run",
]
