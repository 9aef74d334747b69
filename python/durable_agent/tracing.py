"""OpenTelemetry spans for runs, steps, model calls and tool calls; the run's ids on log records.

**Spans** are made when ``opentelemetry-api`` is importable (configure a tracer provider with
the SDK, as for any instrumented library). The API is imported at the first run, never when
`durable_agent` is imported, and only once; without it every hook is one attribute check. Until
a tracer provider is set, a leg makes no spans at all (the API's would record nothing).
``DURABLE_AGENT_TRACING=0`` turns spans off even when it is installed. Under Pyodide (and so in
Cloudflare Workers) spans are off unless ``DURABLE_AGENT_TRACING=1``: importing the API draws
entropy (its context keys are ``uuid4``), which Workers forbid outside a request handler. One call of the loop
(`generate_text`, a resume, `Agent.run`) is one leg of a run. Its spans, with the attributes
of the OpenTelemetry GenAI semantic conventions:

* ``invoke_agent {name}`` — the leg, child of the caller's current span. Named by the
  ``agent_name`` option (else a sub-agent's name; unnamed: ``invoke_agent``, without
  ``gen_ai.agent.name``). ``gen_ai.operation.name`` ``invoke_agent``, ``gen_ai.agent.name``,
  the model's attributes (below), ``gen_ai.conversation.id`` (the `Agent`'s session id, else the
  run id), ``gen_ai.usage.input_tokens`` / ``output_tokens`` (this leg),
  ``durable_agent.run_id``, ``durable_agent.session_id``, ``durable_agent.finish_reason``,
  ``durable_agent.total_tokens`` (the whole run). A leg that continues a stored run (a resume,
  a recovered run, the next call on a session's run) has ``durable_agent.resumed = true`` and
  ``durable_agent.resumed_from_step`` (the last step stored before it), a span link
  (``durable_agent.link = "started_by"``) to the leg that started the run, whatever process ran
  it, and a link (``"continues"``) to the leg it continues when that one ran in this process.
* ``durable_agent.step`` — each step boundary, child of the leg: ``durable_agent.step_index``
  and ``durable_agent.step_kind`` (``model``, or ``settle`` for settling verdicts on resume).
* ``chat {model}`` — each model call (kind CLIENT), child of its step: ``gen_ai.operation.name``
  ``chat``, the model's attributes, ``gen_ai.response.id`` / ``gen_ai.response.model`` (from the
  model's ``response-metadata`` event), ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens`` / ``cache_read.input_tokens`` /
  ``cache_creation.input_tokens``; ``durable_agent.replayed`` when the journal replayed it
  instead of calling the model.
* ``execute_tool {name}`` — each tool call that runs, child of its step and current while the
  tool runs (so a sub-agent's leg, or an instrumented HTTP client, nests under it):
  ``gen_ai.operation.name`` ``execute_tool``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``,
  ``gen_ai.tool.type`` ``function``; a tool that raised has status ERROR and ``error.type``.

A model's attributes are what its ``telemetry_attributes()`` returns (`durable_agent._models`;
the provider adapters give ``gen_ai.provider.name``, ``gen_ai.request.model``, ``server.address``,
``server.port`` and the ``gen_ai.request.*`` settings that are set), over
``gen_ai.provider.name = "_OTHER"`` and ``gen_ai.request.model = model_id``.

**Across processes**: every checkpoint carries the W3C trace context of the leg that started
the run (`AgentCheckpoint.trace_context`), with or without tracing in the legs after it. An
`Agent` run's first checkpoint already carries it (the leg's span starts before that commit),
so a leg resumed after a crash in the run's first step links to it too. A stored context that
is this leg's own (the `Agent`'s fresh run) is not a resume. Checkpoints stored without one
(untraced, or by an earlier release) fall back to the history: a leg resumes when a loop wrote
the stored checkpoint (every boundary ends the history with an assistant or tool message, an
`Agent`'s start checkpoint with the user's prompt); the first traced leg's context is stored
from then on.

A failing leg ends with status ERROR and the exception recorded, and so do the step and model call
it interrupted. A leg, step or tool call stopped by a control signal (a suspension inside a
sub-agent, `Agent.suspend()`, an abort, a lost lease) is not a failure: it carries
``durable_agent.stopped_by`` (the signal's class name) instead.

**Logs**: the loop logs on the ``durable_agent`` logger with ``run_id``, ``step_index`` (the
step in progress, or the next one between steps) and ``session_id`` (the `Agent`'s, else None)
as record attributes (`extra`). Add `RunContextFilter` to a handler whose format names them,
so records that lack them (other loggers) get None instead of a formatting error.
"""

from __future__ import annotations

import logging
import os
import sys
from collections import OrderedDict
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from typing import Any

from ._checkpoint import AgentCheckpoint, Usage
from ._errors import is_control_error

_UNSET: Any = object()
_tracer: Any = _UNSET
_LAST_LEGS = 1024
_last_leg: OrderedDict[str, Any] = OrderedDict()  # run id -> span context of its latest leg in this process
LOG_FIELDS = ("run_id", "step_index", "session_id")


def get_tracer() -> Any:
    """The package's OpenTelemetry tracer, or None (API not installed, or DURABLE_AGENT_TRACING=0).

    Resolved once, at the first run. The tracer follows the global tracer provider, so one set
    after the first run is still used.
    """
    global _tracer
    if _tracer is _UNSET:
        _tracer = _load_tracer()
    return _tracer


def _load_tracer() -> Any:
    setting = os.environ.get("DURABLE_AGENT_TRACING", "").strip().lower()
    if setting in ("0", "false", "no", "off"):
        return None
    if sys.platform == "emscripten" and setting not in ("1", "true", "yes", "on"):
        return None  # importing the API draws entropy (uuid4 context keys): Workers forbid it outside a request
    try:
        from opentelemetry import trace
    except ImportError:
        return None
    from ._version import __version__

    return trace.get_tracer("durable_agent", __version__)


def _recording(tracer: Any) -> Any:
    """`tracer`, or None while no tracer provider is configured.

    Until the application sets one, the API's proxy tracer makes spans that record nothing, and
    a leg would still pay for each of them (a busy server makes a few per step). Decided per leg:
    a provider set later is used from the next leg on. A tracer that is not the API's proxy (one
    from a provider handed over directly) is always used.
    """
    if tracer is None:
        return None
    from opentelemetry import trace

    if isinstance(tracer, trace.ProxyTracer) and isinstance(
        trace.get_tracer_provider(), (trace.ProxyTracerProvider, trace.NoOpTracerProvider)
    ):
        return None
    return tracer


def _usage_attributes(usage: Usage) -> dict[str, int]:
    attributes = {"gen_ai.usage.input_tokens": usage.input_tokens, "gen_ai.usage.output_tokens": usage.output_tokens}
    if usage.cache_read_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_read_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    return attributes


def model_attributes(model: Any) -> dict[str, Any]:
    """The GenAI attributes of `model`'s requests: its own (``telemetry_attributes()``, see
    `durable_agent._models`) over ``gen_ai.provider.name = "_OTHER"`` and its `model_id`."""
    attributes: dict[str, Any] = {"gen_ai.provider.name": "_OTHER", "gen_ai.request.model": model.model_id}
    own = getattr(model, "telemetry_attributes", None)
    if callable(own):
        attributes.update(own())
    return attributes


def trace_context(span: Any) -> dict[str, str]:
    """The W3C trace context of `span` (``traceparent``, and ``tracestate`` when it has one)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def span_context_of(carrier: Mapping[str, str]) -> Any:
    """The span context a stored W3C trace context names, or None when it names none (malformed)."""
    from opentelemetry import trace
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    context = trace.get_current_span(TraceContextTextMapPropagator().extract(dict(carrier))).get_span_context()
    return context if context.is_valid else None


def _fail(span: Any, error: BaseException) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.record_exception(error)
    span.set_attribute("error.type", type(error).__qualname__)
    span.set_status(Status(StatusCode.ERROR, str(error)))


def _stopped(span: Any, error: BaseException) -> None:
    """A span cut short by `error`: a control signal (a suspension, an abort, a lost lease) is
    an attribute, not a failure; anything else is recorded as the failure it is."""
    if is_control_error(error):
        span.set_attribute("durable_agent.stopped_by", type(error).__qualname__)
    else:
        _fail(span, error)


class RunTrace:
    """The spans of one leg of a run. Every method is a no-op when there is no tracer."""

    __slots__ = ("_model", "_run", "_step", "_tracer", "context", "origin")

    def __init__(self) -> None:
        self._tracer = _recording(get_tracer())
        self._run: Any = None
        self._step: Any = None
        self._model: Any = None
        self.context: dict[str, str] | None = None  # this leg's own trace context, once its span started
        self.origin: Mapping[str, str] | None = None  # the trace context every checkpoint of the leg carries

    @property
    def started(self) -> bool:
        """True once `start_run` made the leg's span (a leg started before its loop: `DurableSession.run`)."""
        return self._run is not None

    def _child(self, parent: Any, name: str, attributes: dict[str, Any], **options: Any) -> Any:
        from opentelemetry import trace

        return self._tracer.start_span(name, context=trace.set_span_in_context(parent), attributes=attributes,
                                       **options)

    def start_run(self, run_id: str | None, model: Any, agent_name: str | None, agent_path: tuple[str, ...]) -> None:
        """Start the leg's span: named by `agent_name`, else by the sub-agent's name, else unnamed."""
        if self._tracer is None:
            return
        name = agent_name or (agent_path[-1] if agent_path else None)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent", **model_attributes(model)}
        if name:
            attributes["gen_ai.agent.name"] = name
        if run_id is not None:
            attributes["durable_agent.run_id"] = run_id
        self._run = self._tracer.start_span(f"invoke_agent {name}" if name else "invoke_agent", attributes=attributes)
        self.context = trace_context(self._run)

    def run_loaded(self, run_id: str, session_id: str | None, stored: AgentCheckpoint | None) -> None:
        """The leg knows its run and what was `stored` of it before this leg (None: nothing).

        The checkpoints this leg saves carry the stored trace context on, else this leg's own
        (`origin`), with or without tracing in this process. The leg continues an earlier one
        when another leg wrote the stored checkpoint: one with a trace context not this leg's;
        without one, one written by a loop (every boundary ends the history with an assistant or
        tool message, while an `Agent`'s start checkpoint ends with the user's prompt).
        """
        started_by = stored.trace_context if stored is not None else None
        self.origin = started_by or self.context
        span = self._run
        if span is None:
            return
        resumed_from = None
        if started_by is not None:
            if self.context is None or started_by.get("traceparent") != self.context.get("traceparent"):
                resumed_from = stored.step_index if stored is not None else None
        elif stored is not None and stored.messages and stored.messages[-1]["role"] != "user":
            resumed_from = stored.step_index
        span.set_attribute("durable_agent.run_id", run_id)
        span.set_attribute("gen_ai.conversation.id", session_id or run_id)
        if session_id is not None:
            span.set_attribute("durable_agent.session_id", session_id)
        span.set_attribute("durable_agent.resumed", resumed_from is not None)
        if resumed_from is not None:
            span.set_attribute("durable_agent.resumed_from_step", resumed_from)
            first = span_context_of(started_by) if started_by is not None else None
            if first is not None:
                span.add_link(first, {"durable_agent.link": "started_by"})
            previous = _last_leg.get(run_id)
            if previous is not None and (first is None or previous.span_id != first.span_id):
                span.add_link(previous, {"durable_agent.link": "continues"})

    def end_run(self, run_id: str | None, finish_reason: str | None, usage: Usage, total_usage: Usage,
                error: BaseException | None) -> None:
        span = self._run
        if span is None:
            return
        self.end_step(error)
        span.set_attributes(_usage_attributes(usage))
        span.set_attribute("durable_agent.total_tokens", total_usage.total_tokens)
        if finish_reason is not None:
            span.set_attribute("durable_agent.finish_reason", finish_reason)
        if error is not None:
            _stopped(span, error)
        span.end()
        self._run = None  # ended once: a second end (a leg that failed before its loop) is a no-op
        if run_id is not None:
            _last_leg[run_id] = span.get_span_context()
            _last_leg.move_to_end(run_id)
            while len(_last_leg) > _LAST_LEGS:
                _last_leg.popitem(last=False)

    def start_step(self, step_index: int, kind: str) -> None:
        if self._run is not None:
            self._step = self._child(self._run, "durable_agent.step",
                                     {"durable_agent.step_index": step_index, "durable_agent.step_kind": kind})

    def end_step(self, error: BaseException | None = None) -> None:
        if self._model is not None:
            self.end_model(None, None, error=error or RuntimeError("the step ended during the model call"))
        if self._step is not None:
            if error is not None:
                _stopped(self._step, error)
            self._step.end()
            self._step = None

    def start_model(self, model: Any) -> None:
        if self._step is not None:
            from opentelemetry.trace import SpanKind

            attributes = {"gen_ai.operation.name": "chat", **model_attributes(model)}
            self._model = self._child(self._step, f"chat {attributes['gen_ai.request.model']}", attributes,
                                      kind=SpanKind.CLIENT)

    def end_model(self, usage: Usage | None, finish_reason: str | None, *, replayed: bool = False,
                  error: BaseException | None = None, response: Mapping[str, str] | None = None) -> None:
        """End the model call's span; `response`: the provider's ``id`` and ``model`` of its answer."""
        span = self._model
        if span is None:
            return
        for key, value in (response or {}).items():
            span.set_attribute(f"gen_ai.response.{key}", value)
        if usage is not None:
            span.set_attributes(_usage_attributes(usage))
        if finish_reason is not None:
            span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if replayed:
            span.set_attribute("durable_agent.replayed", True)
        if error is not None:
            _stopped(span, error)
        span.end()
        self._model = None

    @contextmanager
    def tool(self, tool_name: str, tool_call_id: str) -> Iterator[Any]:
        """The span of one tool call, current while the body runs; yields it (None without tracing)."""
        if self._step is None:
            yield None
            return
        from opentelemetry import trace

        span = self._child(self._step, f"execute_tool {tool_name}",
                           {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool_name,
                            "gen_ai.tool.call.id": tool_call_id, "gen_ai.tool.type": "function"})
        with trace.use_span(span, end_on_exit=True, record_exception=False, set_status_on_exception=False):
            try:
                yield span
            except BaseException as error:
                _stopped(span, error)
                raise

    @staticmethod
    def tool_failed(span: Any, error: BaseException) -> None:
        """Mark the tool span of a tool that raised (the loop turns the error into a result)."""
        if span is not None:
            _fail(span, error)


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """The ``durable_agent`` logger, adding the run's `LOG_FIELDS` to every record (`extra`)."""

    def __init__(self, logger: logging.Logger, fields: Any) -> None:
        super().__init__(logger, {})
        self._fields = fields  # a callable returning (run_id, step_index, session_id), read per record

    def process(self, msg: Any, kwargs: MutableMapping[str, Any]) -> tuple[Any, MutableMapping[str, Any]]:
        kwargs["extra"] = {**dict(zip(LOG_FIELDS, self._fields(), strict=True)), **(kwargs.get("extra") or {})}
        return msg, kwargs


class RunContextFilter(logging.Filter):
    """Gives every record the run fields (None when it has none), so a format may name them."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name in LOG_FIELDS:
            if not hasattr(record, name):
                setattr(record, name, None)
        return True


__all__ = ["LOG_FIELDS", "RunContextFilter", "RunLogger", "RunTrace", "get_tracer"]
