"""The options every call takes (`generate_text`, `stream_chat` and both resume entry points), in one place."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

from ._checkpoint import ToolApprovalRequest, ToolApprovalResponse, Usage
from ._errors import ConfigurationError
from ._messages import Message
from ._models import LanguageModel, ModelSettings
from ._retry import RetryPolicy
from ._stop import StopCondition
from ._storage.protocols import CheckpointStore
from ._structured_output import OutputSpec
from ._tools import Tool, ToolSource
from ._util import wall_clock_ms

if TYPE_CHECKING:
    from ._signing import ApprovalSigner

logger = logging.getLogger("durable_agent")

ApproveToolCall = Callable[[ToolApprovalRequest], "bool | ToolApprovalResponse | Awaitable[bool | ToolApprovalResponse]"]


class AbortSignal(Protocol):
    """Anything with `is_set()`, such as `asyncio.Event` or `threading.Event`."""

    def is_set(self) -> bool: ...


class AnySignal:
    """An abort signal set when any of `signals` is (None entries are skipped): a run's own beside its caller's."""

    def __init__(self, *signals: AbortSignal | None) -> None:
        self.signals = tuple(s for s in signals if s is not None)

    def is_set(self) -> bool:
        return any(s.is_set() for s in self.signals)


@dataclass(frozen=True, slots=True)
class PrepareStepContext:
    """What `prepare_step` sees before each model call. `usage` is the whole run's."""

    step_index: int
    step_count: int
    messages: Sequence[Message]
    usage: Usage
    leg_usage: Usage


@dataclass(frozen=True, slots=True)
class StepOverrides:
    """What `prepare_step` may change for one step: the model, which tools are offered, the messages sent."""

    model: LanguageModel | None = None
    active_tools: Sequence[str] | None = None
    messages: Sequence[Message] | None = None


PrepareStep = Callable[[PrepareStepContext], "StepOverrides | None | Awaitable[StepOverrides | None]"]


class AgentOptions(TypedDict, total=False):
    """Keyword options shared by every entry point but `tools` (an `Agent` names its tools apart)."""

    max_steps: int
    stop_when: Sequence[StopCondition]
    prepare_step: PrepareStep
    max_tool_concurrency: int | None
    signal: AbortSignal
    approve_tool_call: ApproveToolCall
    approval_responses: Sequence[ToolApprovalResponse]
    approval_signer: ApprovalSigner
    approval_max_age_ms: int | None
    clock: Callable[[], int]
    generate_id: Callable[[], str]
    runaway_limit: int
    retry: RetryPolicy
    fallback: Sequence[LanguageModel]
    output: Any
    output_retries: int
    agent_name: str
    mcp_servers: Sequence[ToolSource]
    model_settings: ModelSettings


class CallOptions(AgentOptions, total=False):
    """Keyword options shared by every entry point (see the README for each one's meaning)."""

    tools: Mapping[str, Tool]


def random_id() -> str:
    """A fresh random id. Uses entropy, so it is only ever called while a run is going."""
    return uuid.uuid4().hex


def check_durability(store: Any, run_id: Any) -> None:
    """Refuse a `store=`/`run_id=` pair a call cannot checkpoint with, before anything runs."""
    if store is not None and not isinstance(store, CheckpointStore):
        raise ConfigurationError("store must be a CheckpointStore (an object with save(checkpoint) and load(run_id))")
    if run_id is None:
        return
    if not isinstance(run_id, str) or not run_id:
        raise ConfigurationError(f"run_id must be a non-empty str, got {run_id!r}")
    if store is None:
        raise ConfigurationError(
            f"run_id={run_id!r} was given without store=: a run id names a run in a checkpoint store, "
            "so pass the store too (e.g. store=InMemoryCheckpointStore())"
        )


@dataclass(frozen=True, slots=True)
class RunOptions:
    """Resolved options of one call. Built by `RunOptions.build`, which checks every value."""

    model: LanguageModel
    tools: Mapping[str, Tool] = field(default_factory=dict)
    store: CheckpointStore | None = None
    run_id: str | None = None  # with `store`: the run to checkpoint (None: minted when the run starts)
    max_steps: int = 20
    stop_when: Sequence[StopCondition] = ()
    prepare_step: PrepareStep | None = None
    max_tool_concurrency: int | None = None
    signal: AbortSignal | None = None
    approve_tool_call: ApproveToolCall | None = None
    approval_responses: Sequence[ToolApprovalResponse] = ()
    approval_signer: ApprovalSigner | None = None
    approval_max_age_ms: int | None = None
    clock: Callable[[], int] = wall_clock_ms
    generate_id: Callable[[], str] = random_id
    runaway_limit: int = 3
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    fallback: Sequence[LanguageModel] = ()
    output: Any = None  # a JSON Schema or a pydantic model the final answer must match
    output_retries: int = 2
    agent_name: str | None = None  # the agent's name on its spans (gen_ai.agent.name); a sub-agent's: its own
    mcp_servers: Sequence[ToolSource] = ()  # their tools join `tools` for each run (`durable_agent.mcp`)
    model_settings: ModelSettings | None = None  # every model call's own settings (over the model's)
    agent_path: tuple[str, ...] = ()  # internal: set for sub-agents

    @classmethod
    def build(
        cls, model: Any, options: Mapping[str, Any], *, store: Any = None, run_id: Any = None, **internal: Any
    ) -> RunOptions:
        unknown = set(options) - set(CallOptions.__annotations__)
        if unknown:
            raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
        if not isinstance(model, LanguageModel):
            raise ConfigurationError("model must implement LanguageModel (a model_id and a stream(request) method)")
        check_durability(store, run_id)
        values = {k: v for k, v in options.items() if v is not None or k in ("max_tool_concurrency",)}
        run = cls(model=model, store=store, run_id=run_id, **values, **internal)
        run._check()
        return run

    def _check(self) -> None:
        if not isinstance(self.tools, Mapping) or not all(isinstance(t, Tool) for t in self.tools.values()):
            raise ConfigurationError("tools must be a mapping of name to Tool")
        if type(self.max_steps) is not int or self.max_steps < 1:
            raise ConfigurationError("max_steps must be an int of at least 1")
        if self.max_tool_concurrency is not None and (
            type(self.max_tool_concurrency) is not int or self.max_tool_concurrency < 1
        ):
            raise ConfigurationError("max_tool_concurrency must be None or an int of at least 1")
        if type(self.runaway_limit) is not int or self.runaway_limit < 2:
            raise ConfigurationError("runaway_limit must be an int of at least 2")
        if self.approval_max_age_ms is not None and (
            type(self.approval_max_age_ms) is not int or self.approval_max_age_ms <= 0
        ):
            raise ConfigurationError("approval_max_age_ms must be None or a positive int (milliseconds)")
        if self.agent_name is not None and (not isinstance(self.agent_name, str) or not self.agent_name):
            raise ConfigurationError(f"agent_name must be a non-empty str, got {self.agent_name!r}")
        if type(self.output_retries) is not int or self.output_retries < 0:
            raise ConfigurationError("output_retries must be a non-negative int")
        if self.output is not None:
            OutputSpec.build(self.output)  # refuses what cannot be checked, now
        if self.model_settings is not None and not isinstance(self.model_settings, ModelSettings):
            raise ConfigurationError("model_settings must be a ModelSettings")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigurationError("retry must be a RetryPolicy")
        if not all(isinstance(m, LanguageModel) for m in self.fallback):
            raise ConfigurationError("fallback must be a sequence of models (LanguageModel)")
        if isinstance(self.mcp_servers, str | bytes) or not all(isinstance(s, ToolSource) for s in self.mcp_servers):
            raise ConfigurationError("mcp_servers must be a sequence of MCP servers (durable_agent.mcp.StdioServer, ...)")
        names = [s.name for s in self.mcp_servers]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"mcp_servers must have distinct names (give one a name=), got {names}")
        for response in self.approval_responses:
            if not isinstance(response, ToolApprovalResponse):
                raise ConfigurationError("approval_responses must hold ToolApprovalResponse values")

    @property
    def durable(self) -> bool:
        """Only agentic calls (with tools) into a checkpoint store."""
        return self.store is not None and bool(self.tools or self.mcp_servers)
