"""The crash demo: a durable agent run killed with SIGKILL mid-step, resumed by another process.

Run it with ``./scripts/demo`` (or ``python examples/crash_demo.py``). It shows:

1. a worker process running the agent on the SQLite store, killed with SIGKILL while a
   model step is streaming;
2. what the store holds after the crash (the last step boundary, usage, the transcript);
3. a second process resuming the run and finishing it; the ledger shows each tool effect
   happened once per completed step;
4. the run suspending on a human approval in one process, and a third process approving
   it and finishing the run.

Worker processes print one JSON event per line; this script renders them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

import demo_agent

from durable_agent import (
    StreamError,
    StreamFinish,
    StreamStepStart,
    StreamTextDelta,
    StreamToolApprovalRequest,
    StreamToolCall,
    StreamToolResult,
    ToolApprovalResponse,
    resume_stream_from_checkpoint,
    stream_chat,
)
from durable_agent.backends.sqlite import SqliteCheckpointStore

RUN_ID = "demo-run"


# ------------------------------------------------------------------- worker side


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, "pid": os.getpid(), **fields}, default=str), flush=True)


async def worker(mode: str, db: str, ledger: str, delay: float, verdict: str | None) -> None:
    store = SqliteCheckpointStore(db)
    model, tools = demo_agent.model(delay), demo_agent.tools(Path(ledger))
    if mode == "start":
        streamed = stream_chat(model=model, tools=tools, messages=[{"role": "user", "content": demo_agent.PROMPT}],
                               store=store, run_id=RUN_ID, max_steps=10)
    else:
        responses = [ToolApprovalResponse(verdict, True)] if verdict else []
        streamed = resume_stream_from_checkpoint(store, RUN_ID, model=model, tools=tools, max_steps=10,
                                                 approval_responses=responses)
    emit("run", run_id=streamed.run_id, mode=mode)
    async for part in streamed.full_stream:
        if isinstance(part, StreamStepStart):
            emit("step-start", step=part.step_index)
        elif isinstance(part, StreamTextDelta):
            emit("text", text=part.text)
        elif isinstance(part, StreamToolCall):
            emit("tool-call", tool=part.tool_name, input=part.input)
        elif isinstance(part, StreamToolResult):
            emit("tool-result", tool=part.tool_name, output=part.output, is_error=part.is_error)
        elif isinstance(part, StreamToolApprovalRequest):
            emit("approval", approval_id=part.approval_id, tool=part.tool_name, input=part.input)
        elif isinstance(part, StreamFinish):
            emit("finish", reason=part.finish_reason, usage=part.usage.total_tokens, total=part.total_usage.total_tokens)
        elif isinstance(part, StreamError):
            emit("error", error=repr(part.error))
    store.close()


# ------------------------------------------------------------------- parent side


def say(text: str = "") -> None:
    print(text, flush=True)


def spawn(mode: str, db: Path, ledger: Path, delay: float, verdict: str | None = None) -> subprocess.Popen[str]:
    args = [sys.executable, __file__, "worker", mode, str(db), str(ledger), str(delay)]
    if verdict:
        args.append(verdict)
    return subprocess.Popen(args, stdout=subprocess.PIPE, text=True)


def render(event: dict[str, Any], line_open: list[bool]) -> None:
    kind = event["event"]
    if kind == "text":
        if not line_open[0]:
            print(f"  [pid {event['pid']}] model: ", end="")
            line_open[0] = True
        print(event["text"], end="", flush=True)
        return
    if line_open[0]:
        print(flush=True)
        line_open[0] = False
    if kind == "run":
        say(f"  [pid {event['pid']}] {event['mode']} run {event['run_id']!r}")
    elif kind == "step-start":
        say(f"  [pid {event['pid']}] -- step {event['step']} --")
    elif kind == "tool-call":
        say(f"  [pid {event['pid']}] tool call  {event['tool']}({json.dumps(event['input'])})")
    elif kind == "tool-result":
        say(f"  [pid {event['pid']}] tool result {event['tool']}: {event['output']}")
    elif kind == "approval":
        say(f"  [pid {event['pid']}] APPROVAL NEEDED for {event['tool']}({json.dumps(event['input'])}) "
            f"id={event['approval_id'][:12]}...")
    elif kind == "finish":
        say(f"  [pid {event['pid']}] finished: {event['reason']} (this process used {event['usage']} tokens, "
            f"the run {event['total']})")
    elif kind == "error":
        say(f"  [pid {event['pid']}] ERROR {event['error']}")


def follow(proc: subprocess.Popen[str], *, kill_at_step: int | None = None) -> list[dict[str, Any]]:
    """Render a worker's events; with `kill_at_step`, SIGKILL it once that step has streamed some text."""
    events: list[dict[str, Any]] = []
    line_open = [False]
    assert proc.stdout is not None
    current_step, deltas_in_step = -1, 0
    for line in proc.stdout:
        event = json.loads(line)
        events.append(event)
        render(event, line_open)
        if event["event"] == "step-start":
            current_step, deltas_in_step = event["step"], 0
        if kill_at_step is not None and event["event"] == "text" and current_step == kill_at_step:
            deltas_in_step += 1
            if deltas_in_step >= 4:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                print(flush=True)
                say(f"  >>> SIGKILL sent to pid {proc.pid} in the middle of step {current_step} <<<")
                break
    proc.wait()
    return events


def show_store(db: Path) -> None:
    with SqliteCheckpointStore(str(db)) as store:
        checkpoint = store.load(RUN_ID)
    if checkpoint is None:
        say("  (nothing stored)")
        return
    say(f"  run {checkpoint.run_id!r}: status={checkpoint.status}, last boundary {checkpoint.step_id}, "
        f"{len(checkpoint.messages)} messages, {checkpoint.usage.total_tokens} tokens so far")
    if checkpoint.pending_approvals:
        for request in checkpoint.pending_approvals:
            say(f"  pending approval {request.approval_id[:12]}... for {request.tool_name}({json.dumps(request.input)})")


def show_transcript(db: Path) -> None:
    with SqliteCheckpointStore(str(db)) as store:
        checkpoint = store.load(RUN_ID)
    assert checkpoint is not None
    for message in checkpoint.messages:
        content = message["content"]
        if isinstance(content, str):
            say(f"  {message['role']:>9}: {content}")
            continue
        for part in content:
            if part["type"] == "text":
                say(f"  {message['role']:>9}: {part['text']}")
            elif part["type"] == "tool-call":
                say(f"  {message['role']:>9}: -> {part['tool_name']}({json.dumps(part['input'])})")
            elif part["type"] == "tool-result":
                say(f"  {message['role']:>9}: <- {part['tool_name']}: {part['output']}")


def main() -> int:
    delay = float(os.environ.get("DEMO_DELAY", "0.03"))
    with tempfile.TemporaryDirectory(prefix="durable-agent-demo-") as tmp:
        db, ledger = Path(tmp) / "runs.db", Path(tmp) / "ledger.jsonl"
        say(f"Store: SQLite file {db}")
        say("\n== 1. Process A runs the agent; we SIGKILL it mid-step ==")
        follow(spawn("start", db, ledger, delay), kill_at_step=2)
        say("\n== 2. What survived the crash ==")
        show_store(db)
        effects = demo_agent.ledger_entries(ledger)
        say(f"  tool effects so far: {[e['tool'] for e in effects]}")
        say("\n== 3. Process B resumes the run from the store ==")
        events = follow(spawn("resume", db, ledger, delay))
        pending = [e for e in events if e["event"] == "approval"]
        if not pending:
            say("  the run did not suspend on the deploy approval as expected")
            return 1
        say("\n== 4. The run waits for a human. Process C approves the deploy and finishes the run ==")
        show_store(db)
        follow(spawn("resume", db, ledger, delay, verdict=pending[0]["approval_id"]))
        say("\n== The final transcript (loaded from the store) ==")
        show_transcript(db)
        tools_run = [e["tool"] for e in demo_agent.ledger_entries(ledger)]
        say(f"\nTool effects in the ledger: {tools_run}")
        say("Step 2 was interrupted before its tool ran, so it was re-run from the last boundary;"
            " every tool ran exactly once.")
        return 0 if sorted(tools_run) == sorted(["read_file", "read_file", "write_file", "run_tests", "deploy"]) else 1


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "worker":
        _, _, mode, db_path, ledger_path, delay_text, *rest = sys.argv
        asyncio.run(worker(mode, db_path, ledger_path, float(delay_text), rest[0] if rest else None))
    else:
        sys.exit(main())
