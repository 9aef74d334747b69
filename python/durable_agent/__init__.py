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
from .session import InMemorySessionStore, Session, SessionStore

__all__ = [
    "CHECKPOINT_VERSION",
    "NATIVE",
    "AgentCheckpoint",
    "CheckpointConflictError",
    "CheckpointCorruptError",
    "CheckpointNotFoundError",
    "CheckpointVersionError",
    "CodecError",
    "ConfigurationError",
    "DurableAgentError",
    "FeatureUnavailableError",
    "InMemorySessionStore",
    "RunAbortedError",
    "Session",
    "SessionStore",
    "ToolApprovalRequest",
    "ToolApprovalResponse",
    "Usage",
    "__version__",
    "deserialize_checkpoint",
    "serialize_checkpoint",
]
