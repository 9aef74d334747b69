"""The resumable chat endpoint: a plain ASGI application serving durable runs over HTTP and SSE.

::

    from durable_agent import Agent, DurableOptions
    from durable_agent.http import ChatEndpoint, SqliteEventLog
    from durable_agent.backends.sqlite import SqliteRuntime   # or PostgresRuntime + PostgresEventLog

    runtime = SqliteRuntime("agent.db")
    app = ChatEndpoint(
        agent=lambda session_id: Agent(model=..., tools=..., session_id=session_id,
                                       durable=DurableOptions(runtime)),
        runtime=runtime,
        events=SqliteEventLog("agent.db"),
    )
    # uvicorn module:app  ·  hypercorn module:app  ·  starlette_app.mount("/agent", app)

Encryption at rest: give the runtime and the event log one ``encryption=keyring`` (a
`durable_agent.encryption.Keyring`): ``SqliteRuntime("agent.db", encryption=keyring)`` and
``SqliteEventLog("agent.db", encryption=keyring)`` (README, "Encryption at rest").

Routes (JSON bodies; errors are ``{"error": {"code", "message"}}``, never a traceback):

* ``POST /runs`` ``{"session_id", "prompt"}`` (+ ``Idempotency-Key`` header or ``"request_id"``):
  starts the session's next run; 201 with the run's view. A retried POST with the same key
  returns the same run (200) and starts nothing: the key names the run id, and the runtime's
  submissions store remembers the outcome (the same key with another prompt: 409).
* ``GET /runs/{id}``: status, step, final text, usage, pending approvals and client tool calls,
  last event id.
* ``GET /runs/{id}/events``: server-sent events, ``id:`` on every event. With
  ``Last-Event-ID`` (header, or ``?after=``) the reader gets exactly the events after it,
  then the live tail; the stream ends after a leg's ``finish`` (or ``error``). A reader
  already at the end of a leg that nothing follows for now (the run finished, failed, or
  waits for a verdict or a client result) gets 204, so a browser ``EventSource`` stops
  reconnecting; an id the run never sent (past its last event) is a 422.
  ``?format=ui-message-stream`` speaks the AI SDK UI message stream instead
  (`durable_agent.http._ui_stream` documents the mapping).
* ``POST /runs/{id}/approvals`` ``{"approval_id", "approved", "reason"?, "token"?}``: a verdict
  for a parked run (202); the run resumes once every pending approval has one (a verdict stored
  by another process, e.g. ``durable-agent runs approve --runtime``, is noticed by any live
  server within a second: `durable_agent.http._runs`). With an
  ``approval_signer`` on the agent an approval needs the request's token (403 otherwise;
  docs/trust-boundary.md).
* ``POST /runs/{id}/tool-results`` ``{"results": [{"tool_call_id", "output", "is_error"?}]}``:
  the results of client tool calls (tools without ``execute``) the parked run waits for (202);
  recorded in one lease-fenced commit, and the run resumes once nothing else waits.
* ``POST /runs/{id}/cancel``: stops the run for good (202 ``{"run_id", "status": "aborted"}``):
  the leg driven here stops at its next check (never inside a tool call), the interrupted step
  is not checkpointed, and the log ends with an ``error`` (code ``run_aborted``) that no
  reader, server or later verdict continues; 409 ``not_running`` when it has nothing left to do.
  A run another live server drives gets a durable stop request (its stop awakeable,
  `DurableSession.request_stop`) that server acts on within a second: 202 ``{"run_id",
  "status": "stopping", "run_url"}`` (``Location``), and ``GET /runs/{id}`` says ``aborted`` once it did.
* ``POST /chat`` and ``GET /chat/{id}/stream``: what ``useChat``'s default transport calls
  (send a message; the assistant message holding ``addToolResult``'s outputs or
  ``addToolApprovalResponse``'s verdicts; resume the stream after a reload). The chat id is the
  session id, the last user message's id the idempotency key (``trigger: "regenerate-message"``
  starts a new run). ``POST /chat/{id}/stop``: cancel the chat's latest run (``stop()`` only
  aborts the fetch, which a durable run outlives).
* ``EventLog.forget(run_ids)`` / ``prune(before=)`` drop runs and their events (``durable-agent
  runs prune`` calls ``forget`` for the runs it deletes); a pruned run is a 404.
  ``EventLog.parked()`` lists the runs whose log ends parked, for every server's verdict watch.

Statuses: 404 unknown (or pruned) run or route, 405 wrong method, 409 conflict (the session runs
another run, or its interrupted run went on first and parked: ``session_parked``, with
``on_interrupted="resume"``; an idempotency key reused with another prompt, an approval or client
tool call not pending or answered, a run stopped or with nothing left to stop),
413 body too large, 422 bad body or event id, 403 refused by the auth hook (`authorize`), by
CORS (a preflight from an origin not in `CorsSettings`), or a bad approval token.

**Why no event is lost or sent twice.** Events are durable before they are sent: the driver
appends each part the loop streams to the event log (`EventLog`), keyed by the run's durable
progress (`durable_agent.http._progress`: ``step/3/text/12`` is the text of step 3 from its
12th character), and readers only ever read the log. The runtime itself makes every part
durable before the loop yields it (each text delta is a stored stream partial, each tool
result a step record), so when a server dies and another process resumes the run, the step in
flight is re-emitted under the same keys and the log drops what it holds; what the dead
process had committed but not logged is rebuilt from the stored records first. A reader whose
run no live process drives (the lease lapsed, or its owner's pid is gone) takes the run over.

The pure core (events, progress keys, UI mapping, the ASGI app) uses the standard library only.
"""

from __future__ import annotations

from ._app import Authorize, AuthRequest, ChatEndpoint
from ._asgi import CorsSettings, Request
from ._events import EventLog, MemoryEventLog, RunEvent, RunInfo
from ._runs import AgentFactory
from ._sql_logs import PostgresEventLog, SqliteEventLog
from ._ui_stream import UiMessageStream

__all__ = [
    "AgentFactory",
    "AuthRequest",
    "Authorize",
    "ChatEndpoint",
    "CorsSettings",
    "EventLog",
    "MemoryEventLog",
    "PostgresEventLog",
    "Request",
    "RunEvent",
    "RunInfo",
    "SqliteEventLog",
    "UiMessageStream",
]
