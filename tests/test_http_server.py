"""The chat endpoint served by a real uvicorn process, spoken to by a real HTTP client.

Reconnects with Last-Event-ID after a dropped connection and after the server was SIGKILLed
mid-run (another process takes the run over), idempotent starts, approvals with signed
tokens, the AI SDK UI message stream, CORS, and every error status.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from durable_agent import ApprovalSigner
from durable_agent.backends.sqlite import SqliteCheckpointStore
from http_kit import Frame, Server, free_port
from http_server_app import LONG_ANSWER, RECOVERED, SECRET

pytestmark = [
    pytest.mark.host_only("starts uvicorn server processes and kills them"),
    pytest.mark.kernel_independent,  # its subject: the server processes and the HTTP protocol (the rule: pyproject.toml)
]


@pytest.fixture
def paths(tmp_path: Path) -> tuple[Path, Path]:
    return tmp_path / "agent.db", tmp_path / "ledger.jsonl"


@pytest.fixture
def server(paths: tuple[Path, Path]) -> Iterator[Server]:
    srv = Server(*paths).start()
    yield srv
    srv.stop()


def start(srv: Server, session: str, prompt: str, key: str | None = None) -> str:
    status, _, body = srv.request("POST", "/runs", {"session_id": session, "prompt": prompt},
                                  {"idempotency-key": key} if key else None)
    assert status in (200, 201), body
    return str(body["run_id"])


def parked(srv: Server, session: str, prompt: str) -> tuple[str, list[Frame]]:
    """Start a run that parks (on an approval or a client tool): its id and its first leg's events."""
    run_id = start(srv, session, prompt)
    leg1 = list(srv.events(f"/runs/{run_id}/events").frames())
    assert leg1[-1].data["finish_reason"] == "suspended"
    return run_id, leg1


def read_until(frames: Iterator[Frame], stop: Any) -> list[Frame]:
    got = []
    for frame in frames:
        got.append(frame)
        if stop(frame):
            break
    return got


def assert_exact_sequence(frames: list[Frame]) -> None:
    """Ids 1..n, each once, each frame's data naming its own seq: nothing lost, nothing twice."""
    ids = [int(f.id) for f in frames if f.id is not None]
    assert ids == list(range(1, len(ids) + 1))
    assert all(f.data["seq"] == int(f.id) for f in frames if f.id is not None)


def texts_by_step(frames: list[Frame]) -> list[str]:
    steps: dict[int, str] = {}
    for f in frames:
        if f.data["type"] == "text-delta":
            assert f.data["offset"] == len(steps.get(f.data["step_index"], ""))  # contiguous, no overlap
            steps[f.data["step_index"]] = steps.get(f.data["step_index"], "") + f.data["text"]
    return [steps[k] for k in sorted(steps)]


def stored_assistant_texts(db: Path, run_id: str, postgres: str | None = None) -> list[str]:
    if postgres:
        from durable_agent.backends.postgres import PostgresCheckpointStore

        store: Any = PostgresCheckpointStore(postgres)
    else:
        store = SqliteCheckpointStore(str(db))
    try:
        checkpoint = store.load(run_id)
    finally:
        store.close()
    assert checkpoint is not None
    start = max(i for i, m in enumerate(checkpoint.messages) if m["role"] == "user")
    return ["".join(p["text"] for p in m["content"] if p["type"] == "text")
            for m in checkpoint.messages[start + 1:] if m["role"] == "assistant" and isinstance(m["content"], list)
            and any(p["type"] == "text" for p in m["content"])]


def ledger_lines(ledger: Path) -> list[Any]:
    return [json.loads(line) for line in ledger.read_text().splitlines()] if ledger.exists() else []


def kill_while_a_tool_runs(srv: Server, ledger: Path, stream_path: str) -> None:
    """Read `stream_path` until a tool call, wait until the tool started (its ledger line), then SIGKILL `srv`."""
    stream = srv.events(stream_path)
    read_until(stream.frames(), lambda f: f.data["type"] == "tool-call")
    while not ledger_lines(ledger):
        time.sleep(0.01)
    srv.kill()
    stream.close()


def test_a_dropped_connection_resumes_with_last_event_id(paths: tuple[Path, Path]) -> None:
    srv = Server(*paths, delay=0.01).start()
    try:
        run_id = start(srv, "s-drop", "please lookup")
        first = srv.events(f"/runs/{run_id}/events")
        head = read_until(first.frames(), lambda f: f.data["type"] == "text-delta" and f.data["offset"] > 0)
        first.close()  # the connection drops mid-stream
        again = srv.events(f"/runs/{run_id}/events", {"last-event-id": head[-1].id or ""})
        tail = list(again.frames())
        frames = head + tail
        assert_exact_sequence(frames)
        assert frames[-1].data["type"] == "finish" and frames[-1].data["finish_reason"] == "stop"
        assert texts_by_step(frames) == stored_assistant_texts(paths[0], run_id)
        assert texts_by_step(frames)[-1] == LONG_ANSWER
        # a page reload: a new reader from the start gets the same stream
        reload = list(srv.events(f"/runs/{run_id}/events").frames())
        assert [f.data for f in reload] == [f.data for f in frames]
        # a reconnect at the end of the finished run: 204, so an EventSource stops reconnecting
        status, _, body = srv.request("GET", f"/runs/{run_id}/events", headers={"last-event-id": frames[-1].id or ""})
        assert (status, body) == (204, None)
    finally:
        srv.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.host_only("needs a Postgres server"))])
def backend(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """None for the SQLite runtime and event log; a conninfo of a fresh schema for Postgres."""
    if request.param == "sqlite":
        yield None
        return
    from durable_agent.testing.services import postgres_schema

    with postgres_schema("http") as conninfo:
        yield conninfo


@pytest.mark.parametrize("kill_at", ["mid-text", "mid-tool"])
def test_sigkill_mid_run_another_server_completes_the_stream(paths: tuple[Path, Path], kill_at: str,
                                                             backend: str | None) -> None:
    db, ledger = paths
    first = Server(db, ledger, delay=0.05, postgres=backend).start()
    try:
        run_id = start(first, "s-kill", "please lookup")
        stream = first.events(f"/runs/{run_id}/events")
        if kill_at == "mid-text":  # the second model call is streaming its answer
            def stop(f: Frame) -> bool:
                return bool(f.data["type"] == "text-delta" and f.data["step_index"] == 2 and f.data["offset"] > 20)
        else:  # the tool started (its ledger line is written) and sleeps
            def stop(f: Frame) -> bool:
                return bool(f.data["type"] == "tool-call")
        head = read_until(stream.frames(), stop)
        if kill_at == "mid-tool":
            while not ledger_lines(ledger):
                time.sleep(0.01)
        first.kill()
        stream.close()
    finally:
        first.stop()
    second = Server(db, ledger, delay=0.0, postgres=backend).start()
    try:
        tail = list(second.events(f"/runs/{run_id}/events", {"last-event-id": head[-1].id or ""}).frames())
        frames = head + tail
        assert_exact_sequence(frames)
        assert frames[-1].data["type"] == "finish" and frames[-1].data["finish_reason"] == "stop"
        assert texts_by_step(frames) == stored_assistant_texts(db, run_id, backend)
        assert ledger_lines(ledger) == [["lookup", {"q": "answer"}]]  # the tool ran once, never twice
        results = [f.data for f in frames if f.data["type"] == "tool-result"]
        assert len(results) == 1
        if kill_at == "mid-text":
            assert [f.data["finish_reason"] for f in frames if f.data["type"] == "step-finish"] == [
                "tool-calls", "aborted", "stop"]
            assert texts_by_step(frames)[-1] == RECOVERED
            assert LONG_ANSWER.startswith(texts_by_step(frames)[1])
        else:
            assert results[0]["is_error"] and "interrupted" in results[0]["output"]
            assert texts_by_step(frames)[-1] == LONG_ANSWER
        status, _, view = second.request("GET", f"/runs/{run_id}")
        assert status == 200 and view["status"] == "completed" and view["last_event_id"] == len(frames)
    finally:
        second.stop()


def test_a_retried_post_returns_the_same_run(server: Server, paths: tuple[Path, Path]) -> None:
    body = {"session_id": "s-idem", "prompt": "hello"}
    status1, _, first = server.request("POST", "/runs", body, {"idempotency-key": "key-1"})
    status2, _, second = server.request("POST", "/runs", body, {"idempotency-key": "key-1"})
    assert (status1, status2) == (201, 200)
    assert first["run_id"] == second["run_id"]
    frames = list(server.events(f"/runs/{first['run_id']}/events").frames())
    assert frames[-1].data["type"] == "finish"
    status3, _, third = server.request("POST", "/runs", body, {"idempotency-key": "key-1"})
    assert status3 == 200 and third["run_id"] == first["run_id"] and third["status"] == "completed"
    assert sum(1 for f in frames if f.data["type"] == "step-start") == 1  # one run, one step: never started twice
    status, _, error = server.request("POST", "/runs", {"session_id": "s-idem", "prompt": "other"},
                                      {"idempotency-key": "key-1"})
    assert status == 409 and error["error"]["code"] == "idempotency_conflict"
    status4, _, fourth = server.request("POST", "/runs", {**body, "request_id": "key-2"})
    assert status4 == 201 and fourth["run_id"] != first["run_id"]


def test_signed_approvals_park_and_resume_the_run(server: Server) -> None:
    run_id = start(server, "s-approve", "deploy it")
    leg1 = list(server.events(f"/runs/{run_id}/events").frames())
    assert leg1[-1].data == {**leg1[-1].data, "type": "finish", "finish_reason": "suspended"}
    request = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")
    assert ApprovalSigner(SECRET).verify(request["token"]) is not None
    approval = {"approval_id": request["approval_id"], "approved": True}
    status, _, error = server.request("POST", f"/runs/{run_id}/approvals", {**approval, "token": "forged"})
    assert status == 403 and error["error"]["code"] == "token_refused"
    status, _, _ = server.request("POST", f"/runs/{run_id}/approvals", {**approval, "token": request["token"]})
    assert status == 202
    status, _, error = server.request("POST", f"/runs/{run_id}/approvals", {**approval, "token": request["token"]})
    assert status == 409
    leg2 = list(server.events(f"/runs/{run_id}/events", {"last-event-id": leg1[-1].id or ""}).frames())
    assert_exact_sequence(leg1 + leg2)
    assert [f.data["type"] for f in leg2][-1] == "finish" and leg2[-1].data["finish_reason"] == "stop"
    assert next(f.data for f in leg2 if f.data["type"] == "tool-result")["output"]["done"] == "deploy"
    assert texts_by_step(leg2) == ["Deployed."]


def test_ui_message_stream_speaks_the_ai_sdk_protocol(server: Server) -> None:
    from ui_message_stream_schema import check_chunk

    run_id = start(server, "s-ui", "please lookup")
    stream = server.events(f"/runs/{run_id}/events?format=ui-message-stream")
    assert stream.response_headers["x-vercel-ai-ui-message-stream"] == "v1"
    assert stream.response_headers["content-type"].startswith("text/event-stream")
    frames = list(stream.frames())
    assert frames[-1].data == "[DONE]"
    chunks = [f.data for f in frames[:-1]]
    for chunk in chunks:
        check_chunk(chunk)
    assert chunks[0] == {"type": "start", "messageId": run_id}
    assert chunks[-1]["type"] == "finish"
    text = "".join(c["delta"] for c in chunks if c["type"] == "text-delta")
    assert text == "Let me look that up for you." + LONG_ANSWER
    # resume inside one event's chunks: the reader gets the rest of that event, then the others
    middle = next(i for i, f in enumerate(frames) if f.id and f.id.endswith(".1"))
    rest = list(server.events(f"/runs/{run_id}/events?format=ui-message-stream",
                              {"last-event-id": frames[middle - 1].id or ""}).frames())
    assert [f.data for f in rest] == [f.data for f in frames[middle:]]


def test_use_chat_transport_routes(server: Server) -> None:
    body = {"id": "chat-1", "trigger": "submit-message",
            "messages": [{"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hi there"}]}]}
    conn_status, _, _ = server.request("GET", "/chat/chat-1/stream")
    assert conn_status == 204
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/chat", body=json.dumps(body), headers={"content-type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.getheader("x-vercel-ai-ui-message-stream") == "v1"
    raw = response.read().decode()
    conn.close()
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    assert "".join(c["delta"] for c in chunks if c["type"] == "text-delta") == "You said: hi there"
    assert raw.rstrip().endswith("data: [DONE]")
    status, _, _ = server.request("GET", "/chat/chat-1/stream")
    assert status == 204  # the run finished: no stream to resume


def test_cors(server: Server) -> None:
    status, heads, _ = server.request("OPTIONS", "/runs", headers={
        "origin": "http://allowed.example", "access-control-request-method": "POST"})
    assert status == 204 and heads["access-control-allow-origin"] == "http://allowed.example"
    assert "POST" in heads["access-control-allow-methods"] and "idempotency-key" in heads["access-control-allow-headers"]
    status, heads, _ = server.request("GET", "/runs/none", headers={"origin": "http://allowed.example"})
    assert status == 404 and heads["access-control-allow-origin"] == "http://allowed.example"
    status, heads, body = server.request("OPTIONS", "/runs", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert status == 403 and "access-control-allow-origin" not in heads and body["error"]["code"] == "origin_refused"


def test_every_error_is_a_clear_status(server: Server) -> None:
    run_id = start(server, "s-err", "hello")
    list(server.events(f"/runs/{run_id}/events").frames())
    cases: list[tuple[str, str, Any, dict[str, str], bytes | None, int, str]] = [
        ("GET", "/runs/nope", None, {}, None, 404, "unknown_run"),
        ("GET", "/runs/nope/events", None, {}, None, 404, "unknown_run"),
        ("POST", "/runs/nope/approvals", {"approval_id": "a", "approved": True}, {}, None, 404, "unknown_run"),
        ("GET", "/elsewhere", None, {}, None, 404, "not_found"),
        ("DELETE", "/runs", None, {}, None, 405, "method_not_allowed"),
        ("POST", "/runs", None, {}, b"{not json", 422, "bad_body"),
        ("POST", "/runs", None, {}, b"[1, 2]", 422, "bad_body"),
        ("POST", "/runs", {"prompt": "x"}, {}, None, 422, "bad_body"),
        ("POST", "/runs", {"session_id": "s", "prompt": 3}, {}, None, 422, "bad_body"),
        ("POST", "/runs", {"session_id": "", "prompt": "x"}, {}, None, 422, "bad_body"),
        ("POST", f"/runs/{run_id}/approvals", {"approval_id": "a", "approved": "yes"}, {}, None, 422, "bad_body"),
        ("GET", f"/runs/{run_id}/events", None, {"last-event-id": "seven"}, None, 422, "bad_event_id"),
        ("GET", f"/runs/{run_id}/events", None, {"last-event-id": "9999"}, None, 422, "bad_event_id"),
        ("GET", f"/runs/{run_id}/events?format=xml", None, {}, None, 422, "bad_format"),
        ("POST", f"/runs/{run_id}/approvals", {"approval_id": "a", "approved": True}, {}, None, 409, "not_waiting"),
        ("GET", f"/runs/{run_id}", None, {"authorization": "Bearer intruder"}, None, 403, "refused"),
        ("POST", "/runs", {"session_id": "s", "prompt": "x"}, {"authorization": "Bearer intruder"}, None, 403,
         "refused"),
        ("POST", "/runs", None, {}, b"x" * (1 << 21), 413, "body_too_large"),
        ("POST", "/chat", {"id": "c", "messages": []}, {}, None, 422, "bad_body"),
        ("POST", "/chat", {"id": "c", "messages": [{"role": "user", "parts": [{"type": "file"}]}]}, {}, None, 422,
         "bad_body"),
    ]
    for method, path, body, headers, raw, want, code in cases:
        status, heads, answer = server.request(method, path, body, headers, raw)
        assert (status, answer["error"]["code"]) == (want, code), (method, path, answer)
        assert heads["content-type"] == "application/json" and "Traceback" not in json.dumps(answer)


def test_a_second_run_of_a_busy_session_is_a_conflict(paths: tuple[Path, Path]) -> None:
    srv = Server(*paths, delay=0.05).start()
    try:
        run_id = start(srv, "s-busy", "please lookup")
        status, _, body = srv.request("POST", "/runs", {"session_id": "s-busy", "prompt": "again"})
        assert status == 409 and body["error"]["code"] == "session_busy"
        deploy = start(srv, "s-other", "deploy it")
        list(srv.events(f"/runs/{deploy}/events").frames())
        status, _, body = srv.request("POST", f"/runs/{deploy}/approvals", {"approval_id": "nope", "approved": True})
        assert status == 409 and body["error"]["code"] == "not_pending"
        assert list(srv.events(f"/runs/{run_id}/events").frames())[-1].data["type"] == "finish"
    finally:
        srv.stop()


def test_a_restarted_server_continues_killed_runs_before_any_reader_asks(paths: tuple[Path, Path]) -> None:
    db, ledger = paths
    first = Server(db, ledger, delay=0.05).start()
    try:
        run_id = start(first, "s-sweep", "please lookup")
        kill_while_a_tool_runs(first, ledger, f"/runs/{run_id}/events")
    finally:
        first.stop()
    second = Server(db, ledger).start()
    try:
        view: dict[str, Any] = {}
        for _ in range(600):  # no reader: the server's startup sweep drives the run to its end
            _, _, view = second.request("GET", f"/runs/{run_id}")
            if view["status"] == "completed":
                break
            time.sleep(0.05)
        assert view["status"] == "completed" and view["text"] == LONG_ANSWER
        frames = list(second.events(f"/runs/{run_id}/events").frames())
        assert_exact_sequence(frames)
        assert ledger_lines(ledger) == [["lookup", {"q": "answer"}]]
    finally:
        second.stop()


def test_sigkill_in_the_leg_after_an_approval(paths: tuple[Path, Path]) -> None:
    db, ledger = paths
    first = Server(db, ledger, delay=0.05).start()
    try:
        run_id = start(first, "s-leg2", "deploy it")
        leg1 = list(first.events(f"/runs/{run_id}/events").frames())
        request = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")
        status, _, _ = first.request("POST", f"/runs/{run_id}/approvals", {
            "approval_id": request["approval_id"], "approved": True, "token": request["token"]})
        assert status == 202
        while not ledger_lines(ledger):  # the approved tool started: kill the server in its leg
            time.sleep(0.01)
        first.kill()
    finally:
        first.stop()
    second = Server(db, ledger).start()
    try:
        leg2 = list(second.events(f"/runs/{run_id}/events", {"last-event-id": leg1[-1].id or ""}).frames())
        assert_exact_sequence(leg1 + leg2)
        assert leg2[-1].data["type"] == "finish" and leg2[-1].data["finish_reason"] == "stop"
        result = next(f.data for f in leg2 if f.data["type"] == "tool-result")
        assert result["is_error"] and "interrupted" in result["output"]  # started once, never run twice
        assert ledger_lines(ledger) == [["deploy", {"env": "prod"}]]
    finally:
        second.stop()


def test_client_tool_results_over_http(server: Server) -> None:
    run_id, leg1 = parked(server, "s-client", "where home work")
    assert [f.data["tool_call_id"] for f in leg1 if f.data["type"] == "tool-call"] == ["loc-home", "loc-work"]
    path = f"/runs/{run_id}/tool-results"
    status, _, answer = server.request("POST", path, {"tool_call_id": "loc-home", "output": "Paris"})
    assert (status, answer) == (202, {"run_id": run_id, "tool_call_ids": ["loc-home"]})
    _, _, view = server.request("GET", f"/runs/{run_id}")
    assert view["status"] == "suspended" and [c["tool_call_id"] for c in view["pending_tool_calls"]] == ["loc-work"]
    cases: list[tuple[str, Any, dict[str, str], int, str]] = [
        (path, {"tool_call_id": "loc-home", "output": "Nice"}, {}, 409, "already_answered"),
        (path, {"tool_call_id": "loc-moon", "output": "?"}, {}, 409, "not_pending"),
        (path, {"results": []}, {}, 422, "bad_body"),
        (path, {"tool_call_id": "loc-work"}, {}, 422, "bad_body"),
        (path, {"results": [{"tool_call_id": 3, "output": 1}]}, {}, 422, "bad_body"),
        (path, {"results": [{"tool_call_id": "loc-work", "output": 1}] * 2}, {}, 422, "bad_body"),
        (path, {"tool_call_id": "loc-work", "output": "Lyon", "is_error": "no"}, {}, 422, "bad_body"),
        (path, {"tool_call_id": "loc-work", "output": "Lyon"}, {"authorization": "Bearer intruder"}, 403, "refused"),
        ("/runs/nope/tool-results", {"tool_call_id": "loc-work", "output": "Lyon"}, {}, 404, "unknown_run"),
    ]
    for where, body, headers, want, code in cases:
        status, _, error = server.request("POST", where, body, headers)
        assert (status, error["error"]["code"]) == (want, code), (body, error)
        assert "Traceback" not in json.dumps(error)
    status, _, _ = server.request("POST", path, {"results": [{"tool_call_id": "loc-work", "output": "Lyon"}]})
    assert status == 202
    leg2 = list(server.events(f"/runs/{run_id}/events", {"last-event-id": leg1[-1].id or ""}).frames())
    assert_exact_sequence(leg1 + leg2)
    assert [(f.data["type"], f.data.get("tool_call_id"), f.data.get("output")) for f in leg2[:2]] == [
        ("tool-result", "loc-home", "Paris"), ("tool-result", "loc-work", "Lyon")]
    assert texts_by_step(leg2) == ["You are in Paris and Lyon."] and leg2[-1].data["finish_reason"] == "stop"
    status, _, error = server.request("POST", path, {"tool_call_id": "loc-work", "output": "Lyon"})
    assert (status, error["error"]["code"]) == (409, "not_waiting")


def test_sigkill_while_the_run_waits_for_a_client_result(paths: tuple[Path, Path], backend: str | None) -> None:
    """Killed while parked on the client tool; the result goes to another server, which is killed mid-answer too."""
    db, ledger = paths
    first = Server(db, ledger, postgres=backend).start()
    try:
        run_id, leg1 = parked(first, "s-client-kill", "where home")
        first.kill()
    finally:
        first.stop()
    second = Server(db, ledger, delay=0.05, postgres=backend).start()
    try:
        status, _, _ = second.request("POST", f"/runs/{run_id}/tool-results", {"tool_call_id": "loc-home",
                                                                                "output": "Paris"})
        assert status == 202
        stream = second.events(f"/runs/{run_id}/events", {"last-event-id": leg1[-1].id or ""})
        head = read_until(stream.frames(), lambda f: f.data["type"] == "text-delta" and f.data["offset"] > 0)
        second.kill()
        stream.close()
    finally:
        second.stop()
    third = Server(db, ledger, postgres=backend).start()
    try:
        tail = list(third.events(f"/runs/{run_id}/events", {"last-event-id": head[-1].id or ""}).frames())
        frames = leg1 + head + tail
        assert_exact_sequence(frames)
        assert [f.data["output"] for f in frames if f.data["type"] == "tool-result"] == ["Paris"]
        assert tail[-1].data["type"] == "finish" and tail[-1].data["finish_reason"] == "stop"
        assert texts_by_step(leg1 + head + tail) == stored_assistant_texts(db, run_id, backend)
        assert texts_by_step(head + tail)[-1] == RECOVERED  # the cut answer joined as aborted, then the next step
        _, _, view = third.request("GET", f"/runs/{run_id}")
        assert view["status"] == "completed" and view["pending_tool_calls"] == []
    finally:
        third.stop()


def test_use_chat_add_tool_result_continues_the_run(server: Server) -> None:
    from ui_message_stream_schema import check_chunk

    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "where home"}]}
    first = chat_chunks(server, {"id": "chat-tools", "trigger": "submit-message", "messages": [user]})
    run_id = first[0]["messageId"]
    call = next(c for c in first if c["type"] == "tool-input-available")
    assert (call["toolCallId"], call["toolName"]) == ("loc-home", "locate")
    assistant = {"id": run_id, "role": "assistant", "parts": [
        {"type": "step-start"}, {"type": "text", "text": "Let me ask your browser.", "state": "done"},
        {"type": "tool-locate", "toolCallId": "loc-home", "state": "output-available", "input": call["input"],
         "output": {"city": "Paris"}}]}
    body = {"id": "chat-tools", "trigger": "submit-message", "messages": [user, assistant]}
    second = chat_chunks(server, body)
    for chunk in second:
        check_chunk(chunk)
    assert second[:2] == [{"type": "start", "messageId": run_id},
                          {"type": "tool-output-available", "toolCallId": "loc-home", "output": {"city": "Paris"}}]
    assert "".join(c["delta"] for c in second if c["type"] == "text-delta") == "You are in {'city': 'Paris'}."
    assert second[-1]["type"] == "finish" and second[-1]["messageMetadata"]["finishReason"] == "stop"
    assert chat_chunks(server, body) == second  # a retried request: nothing recorded twice, the same stream


def test_use_chat_native_approval_continues_the_run(server: Server) -> None:
    """The stream asks with ai 7's own ``tool-approval-request`` chunk; the message ``addToolApprovalResponse`` leaves
    (the tool part in state ``approval-responded``, the chunk's signature kept) is the verdict, and the run goes on."""
    from ui_message_stream_schema import check_chunk

    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "deploy it"}]}
    first = chat_chunks(server, {"id": "chat-ok", "trigger": "submit-message", "messages": [user]})
    for chunk in first:
        check_chunk(chunk)
    run_id = first[0]["messageId"]
    call = next(c for c in first if c["type"] == "tool-input-available")
    asked = next(c for c in first if c["type"] == "tool-approval-request")
    assert asked["toolCallId"] == call["toolCallId"] and ApprovalSigner(SECRET).verify(asked["signature"])
    assert first[-1]["messageMetadata"]["finishReason"] == "suspended"

    def answered(approved: bool, signature: str) -> dict[str, Any]:
        part = {"type": "tool-deploy", "toolCallId": call["toolCallId"], "state": "approval-responded",
                "input": call["input"], "approval": {"id": asked["approvalId"], "approved": approved,
                                                     "signature": signature}}
        return {"id": "chat-ok", "trigger": "submit-message", "messages": [
            user, {"id": run_id, "role": "assistant", "parts": [{"type": "step-start"}, part]}]}

    status, _, error = server.request("POST", "/chat", answered(True, "forged"))
    assert status == 403 and error["error"]["code"] == "token_refused"
    second = chat_chunks(server, answered(True, asked["signature"]))
    for chunk in second:
        check_chunk(chunk)
    assert second[0] == {"type": "start", "messageId": run_id}
    assert next(c for c in second if c["type"] == "tool-output-available")["output"]["done"] == "deploy"
    assert "".join(c["delta"] for c in second if c["type"] == "text-delta") == "Deployed."
    assert second[-1]["messageMetadata"]["finishReason"] == "stop"
    assert chat_chunks(server, answered(True, asked["signature"])) == second  # a retry: nothing recorded twice
    _, _, view = server.request("GET", f"/runs/{run_id}")
    assert view["status"] == "completed"


def test_use_chat_regenerate_starts_a_new_run(server: Server) -> None:
    """``regenerate()`` sends the same last user message with ``trigger: "regenerate-message"``: a new run answers it,
    where a retried ``submit-message`` gets the run it started."""
    user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "hello again"}]}
    first = chat_chunks(server, {"id": "chat-regen", "trigger": "submit-message", "messages": [user]})
    retried = chat_chunks(server, {"id": "chat-regen", "trigger": "submit-message", "messages": [user]})
    assert retried[0]["messageId"] == first[0]["messageId"]
    again = chat_chunks(server, {"id": "chat-regen", "trigger": "regenerate-message", "messages": [user]})
    assert again[0]["messageId"] != first[0]["messageId"]
    assert "".join(c["delta"] for c in again if c["type"] == "text-delta") == "You said: hello again"
    assert again[-1]["messageMetadata"]["finishReason"] == "stop"
    _, _, view = server.request("GET", f"/runs/{again[0]['messageId']}")
    assert view["status"] == "completed" and view["session_id"] == "chat-regen"


def test_a_stopped_chat_run_ends_as_aborted_and_the_chat_goes_on(paths: tuple[Path, Path]) -> None:
    """``POST /chat/{id}/stop`` (what the stop button calls besides ``useChat``'s ``stop()``): the run stops at its next
    check, before its tool ran, its stream ends with an ``error`` (``run_aborted``), no reader or server continues it,
    and the chat's next message starts a run."""
    import http.client

    db, ledger = paths
    srv = Server(db, ledger, delay=0.2).start()  # the tool starts 1.4 s after the first word: the stop comes before
    try:
        user = {"id": "m1", "role": "user", "parts": [{"type": "text", "text": "please lookup"}]}
        conn = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
        conn.request("POST", "/chat", body=json.dumps({"id": "chat-stop", "messages": [user]}),
                     headers={"content-type": "application/json"})
        response = conn.getresponse()
        chunks = []
        for raw in response:
            line = raw.decode().strip()
            if line.startswith("data: {"):
                chunks.append(json.loads(line[6:]))
                if chunks[-1]["type"] == "text-delta":
                    break  # the model streams: the user presses stop
        run_id = chunks[0]["messageId"]
        status, _, body = srv.request("POST", "/chat/chat-stop/stop", headers={"authorization": "Bearer intruder"})
        assert status == 403
        status, _, body = srv.request("POST", "/chat/chat-stop/stop")
        assert (status, body) == (202, {"run_id": run_id, "status": "aborted"})
        rest = [json.loads(line.decode()[6:]) for line in response if line.startswith(b"data: {")]
        conn.close()
        assert rest[-1]["type"] == "error" and "RunAbortedError" in rest[-1]["errorText"]
        assert ledger_lines(ledger) == []  # the lookup tool never ran
        assert srv.request("POST", f"/runs/{run_id}/cancel")[0] == 409  # stopped already: nothing left to do
        assert srv.request("GET", "/chat/chat-stop/stream")[0] == 204  # nothing to resume
        logged = list(srv.events(f"/runs/{run_id}/events").frames())
        assert logged[-1].data["type"] == "error" and logged[-1].data["code"] == "run_aborted"
        assert (logged[-2].data["type"], logged[-2].data["finish_reason"]) == ("step-finish", "aborted")
    finally:
        srv.stop()
    second = Server(db, ledger).start()  # a restarted server does not take the stopped run over
    try:
        assert [f.data for f in second.events(f"/runs/{run_id}/events").frames()] == [f.data for f in logged]
        user2 = {"id": "m2", "role": "user", "parts": [{"type": "text", "text": "hi again"}]}
        after = chat_chunks(second, {"id": "chat-stop", "messages": [user, user2]})
        assert "".join(c["delta"] for c in after if c["type"] == "text-delta") == "You said: hi again"
        _, _, view = second.request("GET", f"/runs/{run_id}")
        assert view["status"] == "aborted" and not view["driven_here"]  # kept as stored at its last checkpoint
    finally:
        second.stop()


def chat_chunks(server: Server, body: Any) -> list[Any]:
    """POST /chat; the UI message stream's chunks (checked to end with [DONE])."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/chat", body=json.dumps(body), headers={"content-type": "application/json"})
        response = conn.getresponse()
        raw = response.read().decode()
        assert response.status == 200, raw
    finally:
        conn.close()
    assert raw.rstrip().endswith("data: [DONE]")
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]


def test_an_approval_from_the_cli_wakes_the_serving_process(server: Server, paths: tuple[Path, Path]) -> None:
    """``durable-agent runs approve --runtime`` stores the verdict in the runtime's database from another process; the
    server notices it (it polls the awakeables of the runs it parked) and finishes the run with nobody on /events."""
    from cli_kit import cli

    db, ledger = paths
    run_id, leg1 = parked(server, "s-cli", "deploy it #cli")  # the first leg; nobody reads the second
    request = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")
    approved = cli("--runtime", f"sqlite:///{db}", "runs", "approve", run_id, request["approval_id"])
    assert approved.returncode == 0, approved.stderr
    deadline = time.monotonic() + 60  # a bound for a stuck run, not a speed check (benches/ measures the wake-up)
    while (view := server.request("GET", f"/runs/{run_id}")[2])["status"] != "completed":
        assert time.monotonic() < deadline, f"the server did not continue the run: {view}"
        time.sleep(0.05)
    assert view["text"] == "Deployed."
    assert [json.loads(line) for line in ledger.read_text().splitlines()] == [["deploy", {"env": "prod",
                                                                                          "ticket": "#cli"}]]


AI_SDK = Path(__file__).resolve().parent / "aisdk"


def ai_sdk(script: str, *args: str) -> Any:
    """Run one of tests/aisdk's clients of the `ai` package (pinned in its package-lock.json); the JSON it prints."""
    import shutil
    import subprocess

    if shutil.which("node") is None:
        pytest.fail("needs Node.js (and `npm ci` in tests/aisdk/, which this test runs when node_modules is missing or"
                    " older than the package-lock)")
    stamp = AI_SDK / "node_modules" / ".package-lock.json"  # what npm ci installed last
    if not stamp.exists() or stamp.stat().st_mtime < (AI_SDK / "package-lock.json").stat().st_mtime:
        subprocess.run(["npm", "ci", "--no-audit", "--no-fund", "--loglevel=error"], cwd=AI_SDK, check=True,
                       timeout=600)
    done = subprocess.run(["node", str(AI_SDK / script), *args], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def use_chat(srv: Server, scenario: str) -> Any:
    """The `ai` package's own chat client in Node (tests/aisdk/use_chat.mjs) plays `scenario`."""
    return ai_sdk("use_chat.mjs", f"http://127.0.0.1:{srv.port}", scenario)


def test_the_ai_packages_chat_answers_an_approval_with_add_tool_approval_response(server: Server) -> None:
    got = use_chat(server, "approve")
    assert got["asked"] == {"type": "tool-deploy", "state": "approval-requested", "signed": True}
    assert (got["status"], got["errors"]) == ("ready", [])
    assert [m["role"] for m in got["messages"]] == ["user", "assistant"]  # the next leg continued the same message
    answer = got["messages"][1]
    assert answer["text"] == "Deployed." and answer["id"].startswith("run-")
    assert answer["tools"] == [{"type": "tool-deploy", "state": "output-available",
                                "output": {"done": "deploy", "args": {"env": "prod"}}}]


def test_the_ai_packages_chat_denies_with_add_tool_approval_response(server: Server,
                                                                    paths: tuple[Path, Path]) -> None:
    """A denial reaches the chat as ai 7's own ``tool-output-denied`` chunk: the tool part ends in state ``output-denied``
    (not ``output-error``), keeping the verdict and its reason."""
    got = use_chat(server, "deny")
    assert (got["status"], got["errors"]) == ("ready", [])
    [denied] = got["messages"][1]["tools"]
    assert denied["type"] == "tool-deploy" and denied["state"] == "output-denied"
    assert denied["approval"]["approved"] is False and denied["approval"]["reason"] == "not now"
    assert ledger_lines(paths[1]) == []  # denied: the tool never ran


def test_the_ai_packages_chat_stop_and_the_stop_route_end_the_run(paths: tuple[Path, Path]) -> None:
    srv = Server(*paths, delay=0.05).start()
    try:
        got = use_chat(srv, "stop")
        run_id = got["stop"]["runId"]
        assert got["stop"]["status"] == 202 and got["stop"]["body"] == {"run_id": run_id, "status": "aborted"}
        assert (got["afterResume"], got["errors"]) == ("ready", [])
        assert LONG_ANSWER not in got["messages"][-1]["text"]
        logged = list(srv.events(f"/runs/{run_id}/events").frames())
        assert logged[-1].data["type"] == "error" and logged[-1].data["code"] == "run_aborted"
        assert all(f.data["type"] != "text-delta" or f.data["step_index"] == 1 for f in logged)  # no step after it
    finally:
        srv.stop()


def test_the_ai_packages_chat_regenerate_gets_a_new_run(server: Server) -> None:
    got = use_chat(server, "regenerate")
    assert got["regenerated"]["second"] != got["regenerated"]["first"]
    assert [(m["role"], m["text"]) for m in got["messages"]] == [("user", "hello there"),
                                                                 ("assistant", "You said: hello there")]
    _, _, view = server.request("GET", f"/runs/{got['regenerated']['second']}")
    assert view["status"] == "completed"


CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")


@pytest.fixture(scope="module")
def in_chromium(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[Any]]:
    """The chat page (tests/aisdk/page: the `ai` package's chat, bundled with esbuild) in a real headless Chromium plays
    each scenario in a tab of its own, all at once, against one server; the page is served from another origin (the
    endpoint's CORS allows it). Each scenario's outcome (tests/aisdk/use_chat_in_chromium.mjs), and the ledger."""
    if not Path(CHROMIUM).exists():
        pytest.fail(f"needs Chromium at {CHROMIUM} (CHROMIUM= to name another; scripts/test-browser installs it)")
    tmp = tmp_path_factory.mktemp("chromium")
    page_port = free_port()
    # a word every 0.15 s, a tool call 3 s: a reloaded page (a second or more on a loaded machine) comes back to a run
    # still going, which is what the reload tests are about; with 0.05 s it sometimes found the run over (204)
    srv = Server(tmp / "agent.db", tmp / "ledger.jsonl", delay=0.15, origin=f"http://127.0.0.1:{page_port}").start()
    try:
        got = ai_sdk("use_chat_in_chromium.mjs", f"http://127.0.0.1:{srv.port}", str(page_port),
                     "approve", "deny", "reload", "approve-reload")
    finally:
        srv.stop()
    return got, ledger_lines(tmp / "ledger.jsonl")


@pytest.mark.browser
def test_the_ai_packages_chat_in_chromium_approves_with_a_click(in_chromium: tuple[dict[str, Any], list[Any]]) -> None:
    got, ledger = in_chromium
    approve = got["approve"]
    assert approve["asked"] == "tool-deploy approval-requested"  # ai 7's own approval request, rendered as buttons
    assert (approve["status"], approve["errors"], approve["pageErrors"]) == ("ready", [], [])
    assert [m["role"] for m in approve["messages"]] == ["user", "assistant"]
    assert approve["messages"][1]["text"] == "Deployed."
    assert approve["messages"][1]["tools"] == [{"type": "tool-deploy", "state": "output-available", "output": {
        "done": "deploy", "args": {"env": "prod", "ticket": "#approve"}}}]
    # the mount's resume (nothing yet: 204), the message, the verdict sent by sendAutomaticallyWhen
    assert approve["requests"] == ["GET /chat/chat-approve/stream 204", "POST /chat 200", "POST /chat 200"]
    assert [line for line in ledger if line[1].get("ticket") == "#approve"] == [
        ["deploy", {"env": "prod", "ticket": "#approve"}]]


@pytest.mark.browser
def test_the_ai_packages_chat_in_chromium_denies_with_a_click(in_chromium: tuple[dict[str, Any], list[Any]]) -> None:
    got, ledger = in_chromium
    deny = got["deny"]
    assert (deny["status"], deny["errors"], deny["pageErrors"]) == ("ready", [], [])
    [denied] = deny["messages"][1]["tools"]  # ai 7's own denial (tool-output-denied), as in Node
    assert denied["type"] == "tool-deploy" and denied["state"] == "output-denied"
    assert denied["approval"]["approved"] is False and denied["approval"]["reason"] == "not now"
    assert all(line[1].get("ticket") != "#deny" for line in ledger)  # denied: the tool never ran


@pytest.mark.browser
def test_the_ai_packages_chat_in_chromium_resumes_after_a_reload_mid_stream(
        in_chromium: tuple[dict[str, Any], list[Any]]) -> None:
    got, ledger = in_chromium
    reload = got["reload"]
    before = reload["beforeReload"][1]["text"]
    # the reload came mid-stream: some text, the tool's output not yet
    assert before and all(not t["state"].startswith("output-") for t in reload["beforeReload"][1]["tools"])
    assert (reload["status"], reload["errors"], reload["pageErrors"]) == ("ready", [], [])
    # the reloaded page resumed the run (GET .../stream) and never posted the message again
    assert reload["requests"] == ["GET /chat/chat-reload/stream 204", "POST /chat 200",
                                  "GET /chat/chat-reload/stream 200"]
    # the page had kept the cut answer (what came until the reload): the replayed leg replaced it, appended nothing
    [asked, cut] = reload["restored"]
    assert asked == "please lookup #reload" and cut.startswith(before)
    [user, answer] = reload["messages"]
    assert user["text"] == "please lookup #reload" and answer["id"] == reload["beforeReload"][1]["id"]
    assert answer["text"] == "Let me look that up for you." + LONG_ANSWER and answer["text"].startswith(cut)
    assert answer["tools"] == [{"type": "tool-lookup", "state": "output-available", "output": {
        "done": "lookup", "args": {"q": "answer", "ticket": "#reload"}}}]
    assert [line for line in ledger if line[1].get("ticket") == "#reload"] == [
        ["lookup", {"q": "answer", "ticket": "#reload"}]]


@pytest.mark.browser
def test_a_reload_while_the_approved_tool_runs_resumes_the_run_once(
        in_chromium: tuple[dict[str, Any], list[Any]]) -> None:
    """The durable half of a reload in the leg after a verdict: the page resumes (never posts the verdict again) and
    the tool runs once. What the page's chat then shows is the next test's."""
    got, ledger = in_chromium
    reloaded = got["approve-reload"]
    assert reloaded["beforeReload"][1]["tools"] == [{"type": "tool-deploy", "state": "approval-responded"}]
    assert reloaded["requests"] == ["GET /chat/chat-approve-reload/stream 204", "POST /chat 200", "POST /chat 200",
                                    "GET /chat/chat-approve-reload/stream 200"]
    assert [line for line in ledger if line[1].get("ticket") == "#approve-reload"] == [
        ["deploy", {"env": "prod", "ticket": "#approve-reload"}]]


@pytest.mark.browser
def test_a_reload_while_the_approved_tool_runs_shows_the_answer(in_chromium: tuple[dict[str, Any], list[Any]]) -> None:
    reloaded = in_chromium[0]["approve-reload"]
    assert (reloaded["status"], reloaded["errors"], reloaded["pageErrors"]) == ("ready", [], [])
    assert [(m["role"], m["text"]) for m in reloaded["messages"]] == [("user", "deploy it #approve-reload"),
                                                                      ("assistant", "Deployed.")]
    assert reloaded["messages"][1]["tools"] == [{"type": "tool-deploy", "state": "output-available", "output": {
        "done": "deploy", "args": {"env": "prod", "ticket": "#approve-reload"}}}]


def test_a_run_another_live_server_drives_is_stopped_through_any_server(paths: tuple[Path, Path],
                                                                         backend: str | None) -> None:
    """``POST /runs/{id}/cancel`` on server B for a run live server A drives: B records a durable stop request (the
    run's stop awakeable) and answers 202 ``stopping``; A's leg notices it, stops at its next check and ends the log
    with ``run_aborted``; the session is unmarked, so B starts the session's next run."""
    db, ledger = paths
    a = Server(db, ledger, delay=0.2, postgres=backend).start()  # the answer after the tool streams for ~5 s
    b = Server(db, ledger, delay=0.0, postgres=backend).start()
    try:
        run_id = start(a, "s-remote-stop", "please lookup")
        stream = a.events(f"/runs/{run_id}/events")
        head = read_until(stream.frames(), lambda f: f.data["type"] == "text-delta" and f.data["step_index"] == 2)
        status, heads, body = b.request("POST", f"/runs/{run_id}/cancel")
        assert status == 202, body
        assert body == {"run_id": run_id, "status": "stopping", "run_url": f"runs/{run_id}"}
        assert heads["location"] == f"runs/{run_id}"
        frames = head + list(stream.frames())  # A's stream ends with the stop
        assert_exact_sequence(frames)
        assert frames[-1].data["type"] == "error" and frames[-1].data["code"] == "run_aborted"
        assert frames[-2].data == {**frames[-2].data, "type": "step-finish", "step_index": 2,
                                   "finish_reason": "aborted"}  # the step the stop cut
        assert LONG_ANSWER not in texts_by_step(frames)[-1]  # cut mid-answer: no step after it
        assert all(f.data["type"] != "step-start" or f.data["step_index"] <= 2 for f in frames)
        _, _, view = b.request("GET", f"/runs/{run_id}")
        assert view["status"] == "aborted" and not view["driven_here"]
        assert b.request("POST", f"/runs/{run_id}/cancel")[0] == 409  # stopped already
        assert ledger_lines(ledger) == [["lookup", {"q": "answer"}]]
        again = start(b, "s-remote-stop", "hello after")  # the session is free: its next run starts
        assert list(b.events(f"/runs/{again}/events").frames())[-1].data["type"] == "finish"
    finally:
        a.stop()
        b.stop()


def postgres_url(conninfo: str) -> str:
    """A libpq key/value conninfo as the ``postgresql://`` URL the CLI's ``--runtime`` takes (options kept)."""
    from urllib.parse import quote, urlencode

    from psycopg.conninfo import conninfo_to_dict

    parts = conninfo_to_dict(conninfo)
    query = urlencode({"options": parts["options"]}, quote_via=quote) if "options" in parts else ""
    return (f"postgresql://{parts.get('user', '')}@{parts.get('host', '')}:{parts.get('port', 5432)}/"
            f"{parts.get('dbname', '')}" + (f"?{query}" if query else ""))


@pytest.mark.parametrize("b_starts", ["before", "after"])
def test_an_approval_from_the_cli_wakes_a_server_that_did_not_park_the_run(paths: tuple[Path, Path],
                                                                           backend: str | None, b_starts: str) -> None:
    """Server A parks the run and is SIGKILLed; server B never saw the run (it started before the run, or after A
    died: a restarted server) and nobody reads its events. ``durable-agent runs approve --runtime`` stores the
    verdict from a third process; B finds the run parked in the shared log and continues it."""
    from cli_kit import cli

    db, ledger = paths
    b = Server(db, ledger, postgres=backend).start() if b_starts == "before" else None
    a = Server(db, ledger, postgres=backend).start()
    try:
        run_id, leg1 = parked(a, "s-cli-elsewhere", "deploy it #far")
        a.kill()
        b = b or Server(db, ledger, postgres=backend).start()
        request = next(f.data for f in leg1 if f.data["type"] == "tool-approval-request")
        where = postgres_url(backend) if backend else f"sqlite:///{db}"
        approved = cli("--runtime", where, "runs", "approve", run_id, request["approval_id"])
        assert approved.returncode == 0, approved.stderr
        deadline = time.monotonic() + 30  # a bound for a stuck run, not a speed check
        while (view := b.request("GET", f"/runs/{run_id}")[2])["status"] != "completed":
            assert time.monotonic() < deadline, f"no server continued the run: {view}"
            time.sleep(0.05)
        assert view["text"] == "Deployed."
        assert ledger_lines(ledger) == [["deploy", {"env": "prod", "ticket": "#far"}]]
    finally:
        a.stop()
        if b is not None:
            b.stop()
