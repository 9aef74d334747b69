"""durable-agent: durable execution for LLM agent loops.

Everything a user needs is importable from here. Importing this package uses only the
standard library and touches no entropy source (Cloudflare Workers forbid it at import).
"""

from __future__ import annotations

from ._kernels import NATIVE
from ._version import __version__
from .checkpoint import (
    CHECKPOINT_VERSION,
    AgentCheckpoint,
    ToolApprovalRequest,
    ToolApprovalResponse,
    Usage,
    deserialize_checkpoint,
    serialize_checkpoint,
)
from .errors import (
    CheckpointConflictError,
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CodecError,
    ConfigurationError,
    DurableAgentError,
    FeatureUnavailableError,
    RunAbortedError,
)
from .generate import (
    StreamChatResult,
    generate_text,
    resume_from_checkpoint,
    resume_stream_from_checkpoint,
    stream_chat,
)
from .loop import CLIENT_TOOL_PLACEHOLDER, current_tool_call
from .messages import Message
from .models import (
    LanguageModel,
    ModelRequest,
    ScriptedModel,
    ScriptedResponse,
    ScriptedToolCall,
    ToolSpec,
    call,
    reply,
)
from .options import AbortSignal, PrepareStepContext, StepOverrides
from .results import GenerateTextResult, StepResult
from .session import InMemorySessionStore, Session, SessionStore
from .stop import ModelPrice, StopContext, cost_exceeds, step_count_is, total_tokens_exceed
from .subagent import agent_tool
from .tools import Tool

__all__ = [
    "AbortSignal",
    "AgentCheckpoint",
    "CHECKPOINT_VERSION",
    "CLIENT_TOOL_PLACEHOLDER",
    "CheckpointConflictError",
    "CheckpointCorruptError",
    "CheckpointNotFoundError",
    "CheckpointVersionError",
    "CodecError",
    "ConfigurationError",
    "DurableAgentError",
    "FeatureUnavailableError",
    "GenerateTextResult",
    "InMemorySessionStore",
    "LanguageModel",
    "Message",
    "ModelPrice",
    "ModelRequest",
    "NATIVE",
    "PrepareStepContext",
    "RunAbortedError",
    "ScriptedModel",
    "ScriptedResponse",
    "ScriptedToolCall",
    "Session",
    "SessionStore",
    "StepOverrides",
    "StepResult",
    "StopContext",
    "StreamChatResult",
    "Tool",
    "ToolApprovalRequest",
    "ToolApprovalResponse",
    "ToolSpec",
    "Usage",
    "__version__",
    "agent_tool",
    "call",
    "cost_exceeds",
    "current_tool_call",
    "deserialize_checkpoint",
    "generate_text",
    "reply",
    "resume_from_checkpoint",
    "resume_stream_from_checkpoint",
    "serialize_checkpoint",
    "step_count_is",
    "stream_chat",
    "total_tokens_exceed",
]
