"""`ChatEndpoint`: the ASGI application (see `durable_agent.http` for the routes and the guarantees)."""

from __future__ import annotations

import asyncio
import copy
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, overload
from urllib.parse import unquote

from .._checkpoint import AgentCheckpoint, ToolApprovalRequest
from .._errors import ConfigurationError, RunLeaseHeldError, SessionStateError, SubmissionConflictError
from .._kernels import kernels
from .._messages import Message, final_text
from .._options import random_id
from .._parked import waiting_client_calls
from .._storage.protocols import DurableRuntime, EndpointRuntime, EndpointStores
from .._transcript import approval_part
from .._util import maybe_await
from ._asgi import (
    Cors,
    CorsSettings,
    HttpError,
    Receive,
    Request,
    Scope,
    Send,
    field_of,
    read_json,
    send_empty,
    send_error,
    send_json,
    sse_frame,
)
from ._client_tools import ClientResult, parse_results, ui_tool_results
from ._events import EventLog, RunEvent, RunInfo
from ._progress import TERMINAL
from ._runs import AgentFactory, RunDriver
from ._ui_approvals import UiVerdict, ui_tool_approvals
from ._ui_stream import UI_MESSAGE_STREAM_HEADER, UiMessageStream

logger = logging.getLogger("durable_agent.http")

__all__ = ["AuthRequest", "Authorize", "ChatEndpoint"]


@dataclass(frozen=True, slots=True)
class AuthRequest:
    """What the auth hook decides on: the `action` (``start``, ``read``, ``approve``, ``answer``, ``cancel``), the
    request, the run.

    `session_id` is the session the request acts on (from the body for ``start``, from the
    stored run otherwise); `run` is None for ``start``.
    """

    action: str
    request: Request
    session_id: str
    run: RunInfo | None


Authorize = Callable[[AuthRequest], bool | Awaitable[bool]]
"""The auth hook: True lets the request act, False answers 403. Default: every request may act."""

KEEPALIVE_SECONDS = 15.0
TAKEOVER_CHECK_SECONDS = 0.5


def _allow_all(request: AuthRequest) -> bool:
    return True


class ChatEndpoint:
    """A resumable chat endpoint as a plain ASGI 3 application: ``await endpoint(scope, receive, send)``.

    `agent`: builds the durable `Agent` of a session id (all on `runtime`, an `EndpointRuntime`). `events`: the
    durable event log (`SqliteEventLog` on the SQLite runtime's file, `MemoryEventLog` for
    one process). `authorize`: the auth hook. `cors`: browser origins. `resume_on_startup`:
    at ASGI lifespan startup, take over the runs no live process drives (a server restarted
    after a crash continues them before any reader asks; see `startup`). Mount it under a
    prefix in Starlette/FastAPI (``app.mount("/agent", endpoint)``): routes use the scope's
    ``path`` relative to its ``root_path`` as those frameworks pass it.
    """

    def __init__(self, *, agent: AgentFactory, runtime: EndpointRuntime, events: EventLog,
                 authorize: Authorize = _allow_all, cors: CorsSettings | None = None,
                 keepalive_seconds: float = KEEPALIVE_SECONDS, resume_on_startup: bool = True) -> None:
        if not isinstance(runtime, DurableRuntime) or not isinstance(runtime.stores, EndpointStores):
            raise ConfigurationError(
                "runtime must be an EndpointRuntime: a DurableRuntime whose stores hold submissions "
                "(the idempotent POST /runs); the memory, SQLite and Postgres runtimes are"
            )
        self.runtime = runtime
        self.resume_on_startup = resume_on_startup
        self._sweep: asyncio.Future[list[str]] | None = None
        self._watch: asyncio.Future[None] | None = None
        self.events = events
        self.authorize = authorize
        self.cors = cors or CorsSettings()
        self._http = Cors(self._serve, self.cors)
        self.keepalive_seconds = keepalive_seconds
        self.driver = RunDriver(agent, runtime, events)

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1003})  # the endpoint speaks HTTP and SSE only
            return
        await self._http(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        """An HTTP request (past the CORS middleware): its route's handler, or its error as JSON."""
        request = Request.of(scope)
        began = False

        async def tracked(message: dict[str, Any]) -> None:
            nonlocal began
            began = began or message["type"] == "http.response.start"
            await send(message)

        try:
            handler, params = self._route(request, scope)
            await handler(self, request, params, receive, tracked)
        except HttpError as exc:
            await send_error(send, exc)
        except Exception:  # a failure is a 500 with no detail, logged here; never a traceback out
            logger.exception("%s %s failed", request.method, request.path)
            if began:  # a stream already under way: end it; the reader reconnects with its last id
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                await send_error(send, HttpError(500, "internal", "internal server error"))

    async def startup(self) -> None:
        """Take over, in the background, the runs no live process drives (with `resume_on_startup`), and start
        watching the runs parked here for verdicts other processes store (`RunDriver.watch_parked`).

        Called at ASGI lifespan startup. A framework that does not pass lifespan events to a
        mounted app (Starlette's ``Mount``) should call it from its own lifespan.
        """
        if self.resume_on_startup and self._sweep is None:
            self._sweep = asyncio.ensure_future(self.driver.sweep())
        if self._watch is None:
            self._watch = asyncio.ensure_future(self.driver.watch_parked())

    async def shutdown(self) -> None:
        """Stop the runs this process drives: they stay resumable, and the next server takes them over."""
        for background in (self._sweep, self._watch):
            if background is not None:
                background.cancel()
        await self.driver.stop()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _route(self, request: Request, scope: Scope) -> tuple[_Handler, dict[str, str]]:
        """The handler of `request` (in `_ROUTES`) and the path's parameters; 405 or 404 when none serves it."""
        path = request.path
        root = scope.get("root_path", "")
        if root and path.startswith(root):
            path = path[len(root):] or "/"
        methods = set()
        for route in _ROUTES:
            match = route.pattern.fullmatch(path)
            if match is not None:
                if route.method == request.method:
                    return route.handler, {k: unquote(v) for k, v in match.groupdict().items()}
                methods.add(route.method)
        if methods:
            raise HttpError(405, "method_not_allowed", f"{request.method} is not served here")
        raise HttpError(404, "not_found", f"no route for {path}")

    async def _check(self, action: str, request: Request, session_id: str, run: RunInfo | None) -> None:
        if not await maybe_await(self.authorize(AuthRequest(action, request, session_id, run))):
            raise HttpError(403, "refused", f"this request may not {action} here")

    @overload
    async def _latest(self, session_id: str) -> RunInfo | None: ...

    @overload
    async def _latest(self, session_id: str, missing: str) -> RunInfo: ...

    async def _latest(self, session_id: str, missing: str | None = None) -> RunInfo | None:
        """The chat's latest run; None when it has none, or 404 ``unknown_run`` "chat ... `missing`" when asked."""
        run_id = await self.runtime.stores.runs.last(session_id)
        info = await self.events.run_info(run_id) if run_id else None
        if info is None and missing is not None:
            raise HttpError(404, "unknown_run", f"chat {session_id!r} {missing}")
        return info

    async def _run(self, run_id: str) -> RunInfo:
        info = await self.events.run_info(run_id)
        if info is None:
            raise HttpError(404, "unknown_run", f"no run {run_id!r} (never started here, or pruned)")
        return info

    # ---------------------------------------------------------- handlers

    async def _start(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        body = await read_json(receive)
        session_id = field_of(body, "session_id", str)
        prompt = field_of(body, "prompt", str)
        if not session_id:
            raise HttpError(422, "bad_body", "'session_id' must not be empty")
        key = request.headers.get("idempotency-key") or field_of(body, "request_id", str, required=False)
        await self._check("start", request, session_id, None)
        run_id, created = await self._start_run(session_id, prompt, key)
        await send_json(send, 201 if created else 200, await self._view(await self._run(run_id)),
                        [(b"location", f"runs/{run_id}".encode())])

    async def _start_run(self, session_id: str, prompt: str, key: str | None) -> tuple[str, bool]:
        """Start the run of (`session_id`, `prompt`), once per idempotency `key`; (run id, started now)."""
        if key is None:
            run_id = random_id()
        else:
            digest = hashlib.sha256(kernels.encode([session_id, key]).encode()).hexdigest()
            run_id = f"run-{digest[:32]}"  # the same key names the same run, in any process, at any time
            fingerprint = hashlib.sha256(kernels.encode([session_id, prompt]).encode()).hexdigest()
            submissions = self.runtime.stores.submissions
            try:
                _, earlier = await submissions.claim(session_id, key, fingerprint)
            except SubmissionConflictError as exc:
                raise HttpError(409, "idempotency_conflict",
                                "this idempotency key was used with another request") from exc
            if isinstance(earlier, dict) and isinstance(earlier.get("run_id"), str):
                return earlier["run_id"], False
            if await self.events.run_info(run_id) is not None:
                await submissions.complete(session_id, key, {"run_id": run_id})
                return run_id, False
            if await self.driver.checkpoint(run_id) is not None:  # started, then its process died before logging
                await self.events.create_run(run_id, session_id, {})
                await submissions.complete(session_id, key, {"run_id": run_id})
                return run_id, False
        try:
            await self.driver.start(run_id, session_id, prompt, {})
        except (RunLeaseHeldError, SessionStateError, HttpError) as exc:
            if key is not None:
                await self.runtime.stores.submissions.complete(session_id, key, None)  # a retry may start it
            if isinstance(exc, HttpError):
                raise
            if isinstance(exc, SessionStateError):
                raise HttpError(409, "session_state", str(exc)) from exc
            raise HttpError(409, "session_busy", f"session {session_id!r} is running another run") from exc
        if key is not None:
            await self.runtime.stores.submissions.complete(session_id, key, {"run_id": run_id})
        return run_id, True

    async def _show(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        info = await self._run(params["run"])
        await self._check("read", request, info.session_id, info)
        await send_json(send, 200, await self._view(info))

    async def _view(self, info: RunInfo) -> dict[str, Any]:
        checkpoint: AgentCheckpoint | None = await self.driver.checkpoint(info.run_id)
        events = await self.events.read(info.run_id)
        return {
            "run_id": info.run_id,
            "session_id": info.session_id,
            "status": "aborted" if events and events[-1].data.get("code") == "run_aborted"
            else checkpoint.status if checkpoint is not None else "starting",
            "driven_here": self.driver.driving(info.run_id),
            "step_index": checkpoint.step_index if checkpoint is not None else None,
            "text": _answer(checkpoint.messages) if checkpoint is not None else "",
            "usage": checkpoint.usage.to_dict() if checkpoint is not None else None,
            "pending_approvals": [approval_part(r) for r in (checkpoint.pending_approvals or ())]
            if checkpoint is not None and checkpoint.status == "suspended" else [],
            "pending_tool_calls": list(waiting_client_calls(checkpoint, self.driver.agent(info.session_id).tools)
                                       .values()),
            "last_event_id": events[-1].seq if events else 0,
            "events_url": f"runs/{info.run_id}/events",
        }

    async def _approval(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        info = await self._run(params["run"])
        body = await read_json(receive)
        approval_id = field_of(body, "approval_id", str)
        approved = field_of(body, "approved", bool)
        reason = field_of(body, "reason", str, required=False)
        token = field_of(body, "token", str, required=False)
        await self._check("approve", request, info.session_id, info)
        checkpoint = await self.driver.checkpoint(info.run_id)
        if checkpoint is None or checkpoint.status != "suspended":
            raise HttpError(409, "not_waiting", f"run {info.run_id!r} is not waiting for approvals")
        pending = next((r for r in checkpoint.pending_approvals or () if r.approval_id == approval_id), None)
        if pending is None:
            raise HttpError(409, "not_pending", f"approval {approval_id!r} is not pending on run {info.run_id!r}")
        if not await self._verdict(info, checkpoint, pending, approved=approved, reason=reason, token=token):
            raise HttpError(409, "already_answered", f"approval {approval_id!r} has a verdict already")
        await send_json(send, 202, {"run_id": info.run_id, "approval_id": approval_id, "approved": approved})

    async def _verdict(self, info: RunInfo, checkpoint: AgentCheckpoint, pending: ToolApprovalRequest, *,
                       approved: bool, reason: str | None, token: str | None) -> bool:
        """Record the verdict on `pending` (its token checked as the agent's signer wants); False: answered already."""
        options = self.driver.agent(info.session_id).options
        signer = options.get("approval_signer")
        # a sub-agent's request is bound to the sub-agent's run, which checks that binding when it resumes
        bound_to = None if pending.agent_path else info.run_id
        if approved and signer is not None and not signer.check_approval(
            token, approval_id=pending.approval_id, tool_call_id=pending.tool_call_id, tool_name=pending.tool_name,
            input=pending.input, run_id=bound_to, max_age_ms=options.get("approval_max_age_ms"),
        ):
            raise HttpError(403, "token_refused", "the approval token is missing, invalid, expired or for another run")
        try:
            return await self.driver.approve(info, pending, checkpoint.step_index, approved=approved,
                                             reason=reason, token=token)
        except RunLeaseHeldError as exc:
            raise HttpError(409, "session_busy", f"session {info.session_id!r} is running another run; "
                            "nothing was recorded: send the verdict again when it ends") from exc

    async def _cancel(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        """Stop the run for good (202; `RunDriver.cancel`): what a UI's stop button calls besides aborting its fetch."""
        await self._stop(request, await self._run(params["run"]), send)

    async def _chat_stop(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        """Stop the chat's latest run for good (202): ``useChat``'s ``stop()`` only aborts its fetch, and a durable
        run goes on without a reader (a reload resumes it), so the app's stop button calls this too."""
        await self._stop(request, await self._latest(params["session"], "has no run"), send)

    async def _stop(self, request: Request, info: RunInfo, send: Send) -> None:
        await self._check("cancel", request, info.session_id, info)
        try:
            stopped = await self.driver.cancel(info)
        except RunLeaseHeldError as exc:
            raise HttpError(409, "session_busy", f"session {info.session_id!r} is held by another process for "
                            "another run (or by a server that does not take stop requests); nothing was done") from exc
        if stopped is None:
            raise HttpError(409, "not_running", f"run {info.run_id!r} has nothing left to do (finished, failed "
                            "or stopped)")
        if stopped == "aborted":
            await send_json(send, 202, {"run_id": info.run_id, "status": "aborted"})
            return
        # another live process drives it and stops it at its next check: GET the run until its status is 'aborted'
        await send_json(send, 202, {"run_id": info.run_id, "status": "stopping", "run_url": f"runs/{info.run_id}"},
                        [(b"location", f"runs/{info.run_id}".encode())])

    async def _tool_results(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        """The results of client tool calls the parked run waits for (202); it resumes once nothing else waits."""
        info = await self._run(params["run"])
        results = parse_results(await read_json(receive))
        await self._check("answer", request, info.session_id, info)
        await self._answer(info, results)
        await send_json(send, 202, {"run_id": info.run_id, "tool_call_ids": [r.tool_call_id for r in results]})

    async def _answer(self, info: RunInfo, results: Sequence[ClientResult]) -> None:
        try:
            await self.driver.answer_client_calls(info, results)
        except RunLeaseHeldError as exc:
            raise HttpError(409, "session_busy", f"session {info.session_id!r} is running another run; "
                            "nothing was recorded: send the results again when it ends") from exc

    async def _events(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        info = await self._run(params["run"])
        await self._check("read", request, info.session_id, info)
        ui = request.query.get("format", "durable") == "ui-message-stream"
        if request.query.get("format", "durable") not in ("durable", "ui-message-stream"):
            raise HttpError(422, "bad_format", "format is 'durable' or 'ui-message-stream'")
        cursor = request.headers.get("last-event-id") or request.query.get("after") or "0"
        await self._stream(info, cursor, ui, receive, send)

    async def _chat(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        """``useChat``'s default transport: {id, messages, trigger} in, the new run's UI message stream out.

        The last user message's id is the run's idempotency key (a retried request gets the same
        run), except for ``trigger: "regenerate-message"``: each `regenerate()` starts a new run.
        """
        body = await read_json(receive)
        session_id = field_of(body, "id", str, what=" (the chat id)")
        messages = field_of(body, "messages", list)
        last = messages[-1] if messages and isinstance(messages[-1], dict) else None
        if last is not None and last.get("role") == "assistant" and isinstance(last.get("parts"), list):
            verdicts = ui_tool_approvals(last)
            if verdicts:
                await self._chat_approvals(request, session_id, verdicts, receive, send)
            else:
                await self._chat_tool_results(request, session_id, last, receive, send)
            return
        if last is None or last.get("role") != "user" or not isinstance(last.get("parts"), list):
            raise HttpError(422, "bad_body", "the last message must be a user message with parts")
        prompt = "".join(p["text"] for p in last["parts"] if isinstance(p, dict) and p.get("type") == "text"
                         and isinstance(p.get("text"), str))
        if not prompt:
            raise HttpError(422, "bad_body", "the last user message has no text part")
        key = last.get("id") if isinstance(last.get("id"), str) and last.get("id") else None
        if body.get("trigger") == "regenerate-message":
            key = None  # `regenerate()` asks for a new answer to the same message: a new run, never the old one's
        await self._check("start", request, session_id, None)
        run_id, _ = await self._start_run(session_id, prompt, key)
        await self._stream(await self._run(run_id), "0", True, receive, send)

    async def _chat_tool_results(self, request: Request, session_id: str, message: dict[str, Any], receive: Receive,
                                 send: Send) -> None:
        """``addToolResult``'s request: the assistant message with client tool outputs; the run's next leg out.

        The session's latest run gets the results it waits for; results it holds already (a
        retried request) are not sent again. The answer streams the run from its first recorded
        client result of the message on, so a retry gets the same stream.
        """
        info = await self._latest(session_id, "has no run waiting for tool results")
        await self._check("answer", request, session_id, info)
        tools = self.driver.agent(session_id).tools
        posted = [result for name, result in ui_tool_results(message) if name in tools and tools[name].is_client_tool]
        if not posted:
            raise HttpError(422, "bad_body", "the last message must be a user message, or an assistant message "
                            "with outputs of client tools")
        waiting = waiting_client_calls(await self.driver.checkpoint(info.run_id), tools)
        fresh = [r for r in posted if r.tool_call_id in waiting]
        if fresh:
            await self._answer(info, fresh)
        logged = {event.key: event.seq for event in await self.events.read(info.run_id)}
        seqs = [logged[f"result/{r.tool_call_id}"] for r in posted if f"result/{r.tool_call_id}" in logged]
        if not seqs:
            raise HttpError(409, "not_pending", f"the latest run of chat {session_id!r} waits for none of these "
                            "tool calls")
        await self._stream(info, str(min(seqs) - 1), True, receive, send)

    async def _chat_approvals(self, request: Request, session_id: str, verdicts: Sequence[UiVerdict],
                              receive: Receive, send: Send) -> None:
        """``addToolApprovalResponse``'s request: the assistant message with verdicts; the run's next leg out.

        The verdicts on approvals the session's latest run asked for are recorded as on ``POST
        /runs/{run}/approvals`` (tokens checked the same way); a verdict recorded already (a
        retried request, or one sent again in a later message) is not recorded twice. The answer
        streams the run from the end of the leg that asked, so a retry gets the same stream.
        """
        info = await self._latest(session_id, "has no run waiting for approvals")
        await self._check("approve", request, session_id, info)
        logged = await self.events.read(info.run_id)
        asked = {event.key: event.seq for event in logged}
        ours = [v for v in verdicts if f"approval/{v.approval_id}" in asked]
        if not ours:
            raise HttpError(409, "not_pending", f"the latest run of chat {session_id!r} asked for none of these "
                            "approvals")
        for verdict in ours:
            checkpoint = await self.driver.checkpoint(info.run_id)
            pending = next((r for r in (checkpoint.pending_approvals or ()) if r.approval_id == verdict.approval_id),
                           None) if checkpoint is not None and checkpoint.status == "suspended" else None
            if checkpoint is not None and pending is not None:
                await self._verdict(info, checkpoint, pending, approved=verdict.approved, reason=verdict.reason,
                                    token=verdict.token)
        first = min(asked[f"approval/{v.approval_id}"] for v in ours)
        leg_end = next((e.seq for e in logged if e.seq > first and e.data.get("type") in TERMINAL), first)
        await self._stream(info, str(leg_end), True, receive, send)

    async def _chat_resume(self, request: Request, params: dict[str, str], receive: Receive, send: Send) -> None:
        """``useChat``'s stream resumption: the session's latest run while a leg of it is in flight, or 204 when none.

        The whole run from its first event, as one assistant message (the earlier legs' ends are not
        the stream's end), then the leg's live tail: ai 7's default transport (``resumeStreamIsReplay``)
        takes a resumed stream for the whole message and rebuilds the message from it.
        """
        session_id = params["session"]
        info = await self._latest(session_id)
        await self._check("read", request, session_id, info)
        if info is None:
            await send_empty(send, 204)
            return
        await self.driver.ensure_driven(info)
        events = await self.events.read(info.run_id)
        if events and await self._leg_over(info, events[-1].seq):
            await send_empty(send, 204)
            return
        leg_start = max((e.seq for e in events if e.data.get("type") in TERMINAL), default=0)
        await self._stream(info, "0", True, receive, send, through=leg_start)

    # -------------------------------------------------------------- SSE

    async def _stream(self, info: RunInfo, cursor: str, ui: bool, receive: Receive, send: Send,
                      through: int = 0) -> None:
        """Send the run's events after `cursor`, then its live tail, until a leg ends or the client leaves.

        A reader already at the end of a leg that nothing follows for now (finished, failed,
        or parked) gets 204: a browser's EventSource stops reconnecting on it. The ends of legs
        up to event `through` do not end the stream (a replay of the whole run, `_chat_resume`).
        """
        after, skip, folder = await self._place(info, cursor, ui)
        if skip < 0 and await self._leg_over(info, after):
            await send_empty(send, 204)
            return
        headers = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache"),
                   (b"x-accel-buffering", b"no")]
        if ui:
            headers.append((UI_MESSAGE_STREAM_HEADER[0].encode(), UI_MESSAGE_STREAM_HEADER[1].encode()))
        gone = asyncio.Event()
        watcher = asyncio.ensure_future(_watch_disconnect(receive, gone))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # a browser's EventSource reconnects this soon (with Last-Event-ID) when the connection drops
        await send({"type": "http.response.body", "body": b"retry: 1000\n\n", "more_body": True})
        try:
            await self._pump(info, after, skip, folder, send, gone, through)
        finally:
            watcher.cancel()
        if not gone.is_set():
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _place(self, info: RunInfo, cursor: str, ui: bool) -> tuple[int, int, UiMessageStream | None]:
        """Where the reader of `cursor` stands: (last event it has whole, chunks of the next one it has or -1,
        the UI fold brought to that place). 422 when the cursor names no event (or chunk) the run has sent."""
        seq, chunk = _parse_cursor(cursor, ui)
        events = await self.events.read(info.run_id, 0 if ui else max(seq - 1, 0)) if seq > 0 or ui else []
        named = next((e for e in events if e.seq == seq), None)
        if seq > 0 and named is None:  # events are stored before they are sent: the reader cannot have seen it
            raise HttpError(422, "bad_event_id", f"Last-Event-ID {cursor!r} is past the last event of this run")
        if not ui:
            return seq, -1, None
        folder = UiMessageStream(info.run_id)
        for event in events:
            if event.seq >= seq:
                break
            folder.chunks(event.data)  # bring the fold to the reader's place
        if named is None:
            return seq, -1, folder
        count = len(copy.copy(folder).chunks(named.data))
        if chunk >= count:
            raise HttpError(422, "bad_event_id", f"Last-Event-ID {cursor!r}: event {seq} has {count} chunks")
        if chunk < 0 or chunk == count - 1:  # the reader has all of event `seq`
            folder.chunks(named.data)
            return seq, -1, folder
        return seq - 1, chunk, folder  # resend event `seq` from chunk `chunk` + 1

    async def _pump(self, info: RunInfo, after: int, skip: int, folder: UiMessageStream | None, send: Send,
                    gone: asyncio.Event, through: int) -> None:
        loop = asyncio.get_running_loop()
        next_check = 0.0
        idle_since = loop.time()
        while not gone.is_set():
            events = await self.events.read(info.run_id, after)
            for event in events:
                await send({"type": "http.response.body", "body": _frames(event, folder, skip), "more_body": True})
                skip, after = -1, event.seq
                if event.data.get("type") in TERMINAL and event.seq > through:
                    if folder is not None:
                        await send({"type": "http.response.body", "body": sse_frame(None, "[DONE]"),
                                    "more_body": True})
                    return
            if events:
                idle_since = loop.time()
                continue
            if loop.time() >= next_check:
                if await self.events.run_info(info.run_id) is None:
                    return  # pruned while read: the stream ends, and a reconnect gets 404 unknown_run
                await self.driver.ensure_driven(info)
                next_check = loop.time() + TAKEOVER_CHECK_SECONDS
                if await self._leg_over(info, after):
                    return
            if loop.time() - idle_since >= self.keepalive_seconds:
                await send({"type": "http.response.body", "body": b": keep-alive\n\n", "more_body": True})
                idle_since = loop.time()
            await self.events.wait(info.run_id, after, TAKEOVER_CHECK_SECONDS)

    async def _leg_over(self, info: RunInfo, after: int) -> bool:
        """Nothing more will come for now: the log ends a leg at `after` and the run has nothing more to do."""
        events = await self.events.read(info.run_id, after - 1 if after > 0 else 0)
        last = events[-1] if events else None
        if last is None or last.seq != after or last.data.get("type") not in TERMINAL:
            return False
        return last.data["type"] == "error" or not await self.driver.continues(info)


_Handler = Callable[[ChatEndpoint, Request, dict[str, str], Receive, Send], Awaitable[None]]
"""A route's handler: the endpoint, the request, the path's parameters, the ASGI receive and send."""


@dataclass(frozen=True, slots=True)
class _Route:
    """Requests with `method` whose path (below the mount's ``root_path``) matches `pattern` go to `handler`."""

    method: str
    pattern: re.Pattern[str]
    handler: _Handler


_ROUTES: tuple[_Route, ...] = (
    _Route("POST", re.compile(r"/runs/?"), ChatEndpoint._start),
    _Route("GET", re.compile(r"/runs/(?P<run>[^/]+)/?"), ChatEndpoint._show),
    _Route("GET", re.compile(r"/runs/(?P<run>[^/]+)/events/?"), ChatEndpoint._events),
    _Route("POST", re.compile(r"/runs/(?P<run>[^/]+)/approvals/?"), ChatEndpoint._approval),
    _Route("POST", re.compile(r"/runs/(?P<run>[^/]+)/tool-results/?"), ChatEndpoint._tool_results),
    _Route("POST", re.compile(r"/runs/(?P<run>[^/]+)/cancel/?"), ChatEndpoint._cancel),
    _Route("POST", re.compile(r"/chat/?"), ChatEndpoint._chat),
    _Route("GET", re.compile(r"/chat/(?P<session>[^/]+)/stream/?"), ChatEndpoint._chat_resume),
    _Route("POST", re.compile(r"/chat/(?P<session>[^/]+)/stop/?"), ChatEndpoint._chat_stop),
)
"""The endpoint's routes, path → handler (`durable_agent.http` documents them); the first match serves."""


def _answer(messages: Sequence[Message]) -> str:
    """The run's answer so far: the last assistant text after the run's prompt (the last user message)."""
    start = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    return final_text(messages[start + 1:])


_EVENT_ID = re.compile(r"(?P<seq>[0-9]+)(?:\.(?P<chunk>[0-9]+))?")


def _parse_cursor(cursor: str, ui: bool) -> tuple[int, int]:
    """(event seq, chunk of it or -1) of a Last-Event-ID: ``<seq>``, or ``<seq>.<chunk>`` (UI stream, seq 1 on)."""
    match = _EVENT_ID.fullmatch(cursor.strip())
    if match is None or (match["chunk"] is not None and (not ui or int(match["seq"]) == 0)):
        raise HttpError(422, "bad_event_id", f"Last-Event-ID {cursor!r} is not an event id of this run")
    return int(match["seq"]), -1 if match["chunk"] is None else int(match["chunk"])


def _frames(event: RunEvent, folder: UiMessageStream | None, skip: int) -> bytes:
    if folder is None:
        return sse_frame(str(event.seq), kernels.encode({**event.data, "seq": event.seq}))
    chunks = folder.chunks(event.data)
    return b"".join(sse_frame(f"{event.seq}.{n}", kernels.encode(chunk))
                    for n, chunk in enumerate(chunks) if n > skip)


async def _watch_disconnect(receive: Receive, gone: asyncio.Event) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            return
