"""The ``durable-agent runs ...`` commands. Each takes the parsed arguments and the opened backends
and returns an exit code (`durable_agent.cli` documents them); failures raise."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from .._checkpoint import AgentCheckpoint, ToolApprovalResponse, deserialize_checkpoint, serialize_checkpoint
from .._durable_session import approval_key, session_of
from .._errors import (
    CheckpointCorruptError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    ConfigurationError,
)
from .._fork import checkpoint_at_step, fork_run
from .._parked import parked_result, unanswered_approvals
from .._results import GenerateTextResult
from .._util import maybe_await, wall_clock_ms
from ..encryption import Keyring, RekeyReport, rekey_async
from . import _render as r
from ._backends import Backends, CliError, load_factory, open_event_log, require_file

OK, ERROR, USAGE, NOT_FOUND, CONFLICT, UNAVAILABLE, TIMEOUT, UNREACHABLE = 0, 1, 2, 3, 4, 5, 6, 7
CLOSED = 141  # stdout's reader went away (128 + SIGPIPE, the code of a shell tool it killed)


async def _load(backends: Backends, run_id: str, step: int | None = None) -> AgentCheckpoint:
    return await checkpoint_at_step(backends.store, run_id, step)


async def _all_ids(store: Any, status: str | None, limit: int | None, after: str | None) -> list[str]:
    if not hasattr(store, "list"):
        raise CliError(USAGE, f"{type(store).__name__} cannot list its runs")
    return list(await maybe_await(store.list(status=status, limit=limit, after=after)))


async def runs_list(args: argparse.Namespace, b: Backends) -> int:
    ids = await _all_ids(b.store, args.status, args.limit, args.after)
    found: list[AgentCheckpoint | str] = []
    for run_id in ids:
        try:
            cp = await maybe_await(b.store.load(run_id))
        except (CheckpointCorruptError, CheckpointVersionError) as exc:
            found.append(f"{run_id}: {exc}")
            continue
        if cp is not None:  # deleted since it was listed
            found.append(cp)
    if args.json:
        r.emit_json([r.summary_json(cp) if isinstance(cp, AgentCheckpoint) else {"error": cp} for cp in found])
    else:
        rows = [r.summary_row(cp) if isinstance(cp, AgentCheckpoint) else [cp, "unreadable", "", "", "", ""]
                for cp in found]
        r.table(r.SUMMARY_HEADERS, rows)
    return OK


async def runs_show(args: argparse.Namespace, b: Backends) -> int:
    cp = await _load(b, args.run, args.step)
    journal = await b.runtime.inspect.steps(args.run) if b.runtime is not None else None
    if args.json:
        out: dict[str, Any] = {"checkpoint": cp.to_dict()}
        if journal is not None:
            out["journal"] = [_step_json(s) for s in journal]
        r.emit_json(out)
        return OK
    r.table(["FIELD", "VALUE"], [
        ["run", cp.run_id], ["status", cp.status], ["step", cp.step_index], ["saved", r.when(cp.created_at)],
        ["usage", r.usage_text(cp.usage)], ["messages", len(cp.messages)],
        *([["agent", "/".join(cp.agent_path)]] if cp.agent_path else []),
    ])
    print("\nTranscript")
    for i, message in enumerate(cp.messages):
        for line in r.message_lines(i, message, args.full):
            print("  " + line)
    if cp.pending_approvals:
        print("\nPending approvals")
        r.table(r.APPROVAL_HEADERS, r.approval_rows(cp.pending_approvals))
    if journal is not None:
        print("\nJournal steps")
        r.table(["KEY", "KIND", "STATUS", "REPLAY"], [[s.key, s.kind, s.status, s.replay] for s in journal])
    return OK


def _step_json(step: Any) -> dict[str, Any]:
    return {"key": step.key, "kind": step.kind, "status": step.status, "replay": step.replay,
            "session_id": step.session_id, "result": step.result}


async def runs_verdict(args: argparse.Namespace, b: Backends) -> int:
    """``approve`` / ``deny``: through the runtime's awakeable when there is a runtime, else by resuming."""
    approved = args.command == "approve"
    cp = await _load(b, args.run)
    pending = {p.approval_id: p for p in cp.pending_approvals or ()}
    missing = [a for a in args.approval_id if a not in pending]
    if missing:
        raise CliError(NOT_FOUND, f"approval {', '.join(missing)} is not pending on run {args.run!r}"
                       f" (pending: {', '.join(pending) or 'none'})")
    if args.token is not None and len(args.approval_id) > 1:
        raise CliError(USAGE, "--token names one approval: give one APPROVAL_ID with it")
    responses = [
        ToolApprovalResponse(a, approved, args.reason, args.token if args.token is not None else pending[a].token)
        for a in args.approval_id
    ]
    if b.runtime is not None and await _parked_in_journal(b.runtime, cp, args.approval_id):
        from .._agent import resolve_approval

        for response in responses:
            if not await resolve_approval(b.runtime, response.approval_id, approved=approved,
                                          reason=response.reason, token=response.token):
                raise CliError(NOT_FOUND, f"no run waits on approval {response.approval_id!r} in the runtime")
        if args.agent is None:
            _said(args, {"run_id": args.run, "approvals": args.approval_id, "approved": approved, "resumed": False},
                  f"{'approved' if approved else 'denied'} {', '.join(args.approval_id)};"
                  " a server that parked the run continues it, else its next resume settles it")
            return OK
        return await _resume(args, b, ())
    left = sorted(set(pending) - set(args.approval_id))
    if left:
        raise CliError(USAGE, f"run {args.run!r} also waits on {', '.join(left)}: a resume denies every approval"
                       " left unanswered, so name them all")
    if args.agent is None:
        where = ("has no awakeable in the runtime (a fork made without --runtime has none: it copies the checkpoint,"
                 " not the journal)" if b.runtime is not None else "is in a store (for an Agent's run, pass --runtime URL)")
        raise CliError(USAGE, f"run {args.run!r} {where}: it is approved by resuming it, pass --agent module:factory")
    return await _resume(args, b, responses)


async def _parked_in_journal(runtime: Any, checkpoint: AgentCheckpoint, approval_ids: list[str]) -> bool:
    """Whether the runtime's journal parked `checkpoint`'s run on these approvals: an awakeable of each, under its
    run id, in its session (`session_of`: a fork made with ``--runtime`` is in its original's). A fork made in the
    store has none (it copies the checkpoint, not the journal): it is approved by resuming it. Forks made before
    `fork_run` gave them fresh approval ids hold their original's, whose awakeables must not get their verdicts."""
    session = await session_of(runtime, checkpoint.run_id)
    if session is None:
        return False
    for approval_id in approval_ids:
        key = approval_key(checkpoint.run_id, checkpoint.step_index, approval_id)
        if await runtime.find_awakeable(session, key) is None:
            return False
    return True


async def runs_resume(args: argparse.Namespace, b: Backends) -> int:
    return await _resume(args, b, ())


async def _resume(args: argparse.Namespace, b: Backends, responses: Any) -> int:
    try:
        with r.progress(f"resuming {args.run}"):
            result = await _next_leg(await load_factory(args.agent), b, args.run, responses)
    except ConfigurationError as exc:  # raised by the agent's code (a model without its key): not a usage error
        raise CliError(ERROR, f"--agent {args.agent}: {exc}") from exc
    if result is None:
        _said(args, {"run_id": args.run, "resumed": False}, f"run {args.run} has nothing to continue")
        return OK
    out = {
        "run_id": args.run, "resumed": True, "finish_reason": result.finish_reason, "text": result.text,
        "usage": result.usage.to_dict(), "total_usage": result.total_usage.to_dict(),
        "pending_approvals": [p.to_dict() for p in result.pending_approvals],
    }
    if args.json:
        r.emit_json(out)
        return OK
    print(f"run {args.run}: {result.finish_reason} (this leg: {r.usage_text(result.usage)})")
    if result.text:
        print(r.cut(result.text))
    if result.pending_approvals:
        r.table(r.APPROVAL_HEADERS, r.approval_rows(result.pending_approvals))
    return OK


async def _next_leg(made: Any, b: Backends, run_id: str, responses: Any) -> GenerateTextResult | None:
    """Drive `run_id` on with what the ``--agent`` factory `made`: an `Agent` (its `resume`) or the options of
    `resume_from_checkpoint`. None when nothing is left to continue: a completed run is never driven again. A
    parked run some approval of which has no verdict is returned as it parked, as `Agent.resume` does: a resume
    would deny it, and a pending decision is never taken for the user (``runs deny`` says no)."""
    if not isinstance(made, Mapping):
        result: GenerateTextResult | None = await made.resume(run_id=run_id, approval_responses=responses)
        return result
    checkpoint = await _load(b, run_id)
    if checkpoint.status == "completed":
        return None
    options = dict(made)
    if responses:
        options["approval_responses"] = [*options.get("approval_responses", ()), *responses]
    if unanswered_approvals(checkpoint, {r.approval_id for r in options.get("approval_responses", ())}):
        return parked_result(checkpoint, options.get("tools"))
    from .._generate import resume_from_checkpoint

    return await resume_from_checkpoint(b.store, run_id, **options)


def _said(args: argparse.Namespace, data: Any, text: str) -> None:
    if args.json:
        r.emit_json(data)
    else:
        print(text)


_AGO = re.compile(r"([0-9]+)([smhd])")
_UNIT_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_before(text: str, now_ms: int) -> int:
    """``--before``: epoch milliseconds, an ISO 8601 time (UTC when it names no zone), or an age
    such as ``30m``, ``12h``, ``7d`` (that long before now)."""
    if text.isascii() and text.isdigit():
        return int(text)
    ago = _AGO.fullmatch(text)
    if ago:
        return now_ms - int(ago[1]) * _UNIT_MS[ago[2]]
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigurationError(
            f"--before takes epoch ms, an ISO 8601 time or an age like 7d/12h/30m, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _event_log(args: argparse.Namespace, b: Backends) -> Any:
    """The chat endpoint's event log (`--events`, default: the store's database when it is SQLite or Postgres,
    where the endpoint's documented setup keeps it), opened with the CLI's keyring; None for another store."""
    events_url = args.events or os.environ.get("DURABLE_AGENT_EVENTS") or args.store or args.runtime
    require_file(events_url)
    log = open_event_log(events_url, b.keyring)
    if log is None and (args.events or os.environ.get("DURABLE_AGENT_EVENTS")):
        raise ConfigurationError(f"an event log URL is sqlite:///path or postgresql://..., got {events_url!r}")
    return log


async def runs_prune(args: argparse.Namespace, b: Backends) -> int:
    """Delete the runs, then their events in the chat endpoint's event log (`_event_log`)."""
    before = parse_before(args.before, wall_clock_ms())
    log = _event_log(args, b)
    try:
        with r.progress("pruning"):
            doomed = await maybe_await(b.store.prune(before=before, status=args.status,
                                                     include_suspended=args.include_suspended))
            forgotten = await log.forget(doomed) if log is not None else None
    finally:
        if log is not None:
            await maybe_await(log.close())
    _said(args, {"deleted": doomed, "before": before, "events_deleted": forgotten},
          f"deleted {len(doomed)} run(s) saved before {r.when(before)}"
          + (f", and the endpoint events of {len(forgotten)}" if forgotten else "")
          + "".join(f"\n  {d}" for d in doomed))
    return OK


async def runs_rekey(args: argparse.Namespace, b: Backends) -> int:
    """Rewrite every sealed row not under the primary key of ``DURABLE_AGENT_KEYS`` to it (`rekey_async`): the
    store's, then the runtime's with ``--runtime``, then the chat endpoint's event log's (`_event_log`). One
    progress line per batch on stderr when it is a terminal; the summary on stdout. Exit 1 when a row could not be
    opened (the summary names the first)."""
    keyring = b.keyring or Keyring.from_env()  # unset: the error says so
    if type(args.batch_size) is not int or args.batch_size < 1:
        raise CliError(USAGE, f"--batch-size must be a positive number of rows, got {args.batch_size}")
    total = RekeyReport()
    log = _event_log(args, b)
    try:
        for target in (b.store, b.runtime, log):
            if target is not None:
                total += await rekey_async(target, keyring, batch_size=args.batch_size, strict=args.strict,
                                           progress=r.rekey_progress(total))
    finally:
        if log is not None:
            await maybe_await(log.close())
    r.end_progress_line()
    data = {"primary": keyring.primary, "examined": total.examined, "rewritten": total.rewritten,
            "current": total.current, "changed": total.changed, "refused": total.refused,
            "refusals": list(total.refusals), "batches": total.batches}
    _said(args, data, r.rekey_summary(keyring.primary, total))
    return OK if total.refused == 0 else ERROR


async def runs_fork(args: argparse.Namespace, b: Backends) -> int:
    """With ``--runtime``, an Agent's run is forked into its session, parked on awakeables of its own (approved with
    ``--runtime`` alone); a run the runtime never journaled is forked in the store, as without it."""
    session = await session_of(b.runtime, args.run) if b.runtime is not None else None
    forked = await fork_run(b.store, args.run, new_run_id=args.to, at_step=args.at,
                            runtime=b.runtime if session is not None else None, session_id=session)
    waits = [p.approval_id for p in forked.pending_approvals or ()]  # fresh ids: the original's are not the fork's
    _said(args, {**r.summary_json(forked), "pending_approvals": waits},
          f"forked {args.run} at step {forked.step_index} to {forked.run_id} ({forked.status},"
          f" {len(forked.messages)} messages)" + (f"; it waits on approval {', '.join(waits)}" if waits else ""))
    return OK


async def runs_export(args: argparse.Namespace, b: Backends) -> int:
    """One line per run: its latest checkpoint as codec text (bytes kept). The step log is not exported."""
    ids = args.run or await _all_ids(b.store, args.status, None, None)
    lines = []
    for run_id in ids:
        cp = await maybe_await(b.store.load(run_id))
        if cp is None:
            if args.run:
                raise CheckpointNotFoundError(run_id)
            continue
        lines.append(serialize_checkpoint(cp) + "\n")
    if args.output in (None, "-"):
        sys.stdout.write("".join(lines))
        return OK
    b.refuse_own_file(args.output, "--output")
    with open(args.output, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    _said(args, {"exported": len(lines), "file": args.output}, f"exported {len(lines)} run(s) to {args.output}")
    return OK


async def runs_import(args: argparse.Namespace, b: Backends) -> int:
    """Read every line first: a bad line or a run that exists (without --overwrite) writes nothing."""
    if args.input in (None, "-"):
        data = sys.stdin.buffer.read()
    else:
        b.refuse_own_file(args.input, "FILE")
        with open(args.input, "rb") as f:
            data = f.read()
    checkpoints = []
    for number, line in enumerate(_text(data).splitlines(), 1):
        if line.strip():
            try:
                checkpoints.append(deserialize_checkpoint(line))
            except CheckpointCorruptError as exc:
                raise CheckpointCorruptError(f"line {number}: {exc}") from None
    if not args.overwrite:
        taken = [cp.run_id for cp in checkpoints if await maybe_await(b.store.load(cp.run_id)) is not None]
        if taken:
            raise CliError(CONFLICT, f"runs already stored (pass --overwrite to replace them): {', '.join(taken)}")
    with r.progress(f"importing {len(checkpoints)} run(s)"):
        for cp in checkpoints:
            await maybe_await(b.store.save(cp))
    _said(args, {"imported": [cp.run_id for cp in checkpoints]}, f"imported {len(checkpoints)} run(s)")
    return OK


def _text(data: bytes) -> str:
    """An import's input as text; `CheckpointCorruptError` naming the line when it is not UTF-8 (a binary file)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise CheckpointCorruptError(
            f"line {line} is not UTF-8 text (byte {data[exc.start]:#04x}):"
            " runs import reads the JSON lines runs export writes"
        ) from None


async def runs_watch(args: argparse.Namespace, b: Backends) -> int:
    """Poll the run; print each new message and status change; stop when it completes (or suspends).

    A run with no checkpoint yet is waited for (a watcher started beside the run it watches), once said so
    (``{"type": "waiting"}``); a run that disappears once seen was deleted: not found."""
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    shown, last, waiting = 0, None, False
    while True:
        cp = await maybe_await(b.store.load(args.run))
        if cp is None and last is not None:
            raise CheckpointNotFoundError(args.run)
        if cp is None and not waiting:
            waiting = True
            _said(args, {"type": "waiting", "run_id": args.run}, f"-- run {args.run} has no checkpoint yet: waiting")
        if cp is not None:
            shown, last = _watched(args, cp, shown, last)
            if cp.status == "completed" or (cp.status == "suspended" and not args.follow):
                return OK
        sys.stdout.flush()
        if deadline is not None and time.monotonic() >= deadline:
            state = f"is still {cp.status}" if cp is not None else "has saved no checkpoint"
            raise CliError(TIMEOUT, f"run {args.run} {state} after {args.timeout:g}s")
        await asyncio.sleep(args.interval)


def _watched(args: argparse.Namespace, cp: AgentCheckpoint, shown: int, last: Any) -> tuple[int, Any]:
    """Print what `watch` has not shown of `cp` yet: the messages from index `shown`, its state when not `last`."""
    if shown > len(cp.messages):
        shown = 0  # the history was rewritten: show it again
    for i in range(shown, len(cp.messages)):
        if args.json:
            r.emit_json({"type": "message", "index": i, "message": cp.messages[i]})
        else:
            print("\n".join(r.message_lines(i, cp.messages[i])))
    state = (cp.step_index, cp.status)
    if state != last:
        if args.json:
            r.emit_json({"type": "status", **r.summary_json(cp),
                         "pending_approvals": [p.to_dict() for p in cp.pending_approvals or ()]})
        else:
            print(f"-- step {cp.step_index}: {r.paint(cp.status, r.STATUS_COLOURS.get(cp.status), sys.stdout)}"
                  f" ({r.usage_text(cp.usage)})")
            if cp.pending_approvals:
                r.table(r.APPROVAL_HEADERS, r.approval_rows(cp.pending_approvals))
    return len(cp.messages), state
