"""What the CLI prints: tables, transcripts and JSON, kept apart from what it does.

On a terminal, and only there, it adds colour (bold headers, run statuses, the error prefix) unless
``NO_COLOR`` is set to anything but the empty string (no-color.org) or ``TERM`` is ``dumb``; and a
spinner with the seconds elapsed on stderr while a long operation runs (`progress`), erased
before the result is printed. Piped or redirected output is plain text, as before.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, TextIO

from .._checkpoint import AgentCheckpoint, ToolApprovalRequest, Usage
from .._kernels import kernels
from .._messages import Message, content_parts

WIDTH = 160  # a value longer than this is cut in tables and transcripts (`--json` never cuts)
BOLD, RED = "1", "31"
STATUS_COLOURS = {"completed": "32", "suspended": "33", "running": "36"}  # green, yellow, cyan


def is_terminal(stream: TextIO) -> bool:
    """Whether `stream` is an interactive terminal that takes escape sequences (not ``TERM=dumb``)."""
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def paint(text: str, code: str | None, stream: TextIO) -> str:
    """`text` in the SGR colour `code` when `stream` is a terminal and ``NO_COLOR`` is unset (or empty)."""
    if code is None or os.environ.get("NO_COLOR") or not is_terminal(stream):
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


@contextlib.contextmanager
def progress(text: str, stream: TextIO | None = None) -> Iterator[None]:
    """A spinner, `text` and the seconds elapsed on `stream` (stderr) while the block runs, erased after; nothing
    unless it is a terminal. A thread draws it: a block that keeps the event loop busy does not freeze it."""
    out = stream or sys.stderr
    if not is_terminal(out):
        yield
        return
    done, start = threading.Event(), time.monotonic()

    def spin() -> None:
        for frame in itertools.cycle("|/-\\"):
            out.write(f"\r{frame} {text} {time.monotonic() - start:.1f}s")
            out.flush()
            if done.wait(0.1):
                return

    spinner = threading.Thread(target=spin, name="durable-agent-progress", daemon=True)
    spinner.start()
    try:
        yield
    finally:
        done.set()
        spinner.join()
        out.write("\r\x1b[K")  # erase the line: the result is printed where the spinner was
        out.flush()


def rekey_progress(before: Any, stream: TextIO | None = None) -> Any:
    """A `rekey` progress callback writing one line per batch to `stream` (stderr), rewritten in place, when it
    is a terminal (`before`: the report of the targets already done); None elsewhere."""
    out = stream or sys.stderr
    if not is_terminal(out):
        return None

    def show(report: Any) -> None:
        done = before + report
        out.write(f"\r\x1b[Kbatch {done.batches}: {done.examined} row(s) examined, {done.rewritten} rewritten")
        out.flush()

    return show


def end_progress_line(stream: TextIO | None = None) -> None:
    """Erase the progress line `rekey_progress` left on a terminal."""
    out = stream or sys.stderr
    if is_terminal(out):
        out.write("\r\x1b[K")
        out.flush()


def rekey_summary(primary: str, report: Any) -> str:
    """What `runs rekey` did, in a few lines."""
    lines = [
        f"rekeyed to key {primary!r}: {report.examined} row(s) examined in {report.batches} batch(es),"
        f" {report.rewritten} rewritten, {report.current} already under it"
    ]
    if report.changed:
        lines.append(f"{report.changed} row(s) changed by another writer meanwhile (left as written; run it again to"
                     " check them)")
    if report.refused:
        lines.append(f"{report.refused} row(s) could not be opened and were left as they are:")
        lines += [f"  {problem}" for problem in report.refusals]
        if report.refused > len(report.refusals):
            lines.append(f"  ... and {report.refused - len(report.refusals)} more")
    elif not report.changed:
        lines.append("every row is under the primary key: the other keys can be dropped from the ring")
    return "\n".join(lines)


def as_json(value: Any) -> str:
    """`value` as one line of JSON, through the checkpoint codec: bytes survive as ``{"$bytes": ...}``."""
    return kernels.encode(value)


def emit_json(value: Any, out: TextIO | None = None) -> None:
    print(as_json(value), file=out or sys.stdout)


def when(epoch_ms: int) -> str:
    """Epoch milliseconds as ISO 8601 UTC, to the second."""
    try:
        return datetime.fromtimestamp(epoch_ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):
        return str(epoch_ms)


def cut(text: str, width: int = WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def brief(value: Any) -> str:
    """A one-line form of a tool input or output (bytes shown by size)."""
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    try:
        return as_json(value)
    except ValueError:
        return repr(value)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], out: TextIO | None = None) -> None:
    """Left-aligned columns separated by two spaces; nothing but the header when there are no rows.
    On a terminal the header is bold and run statuses are coloured (see the module docs)."""
    stream = out or sys.stdout
    cells = [[str(c) for c in headers], *[[cut(str(c), 80) for c in row] for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        painted = (paint(c, BOLD if n == 0 else STATUS_COLOURS.get(c), stream) + " " * (w - len(c))
                   for c, w in zip(row, widths, strict=True))
        print("  ".join(painted).rstrip(), file=stream)


def usage_text(usage: Usage) -> str:
    return f"input {usage.input_tokens}, output {usage.output_tokens}, total {usage.total_tokens}"


def summary_row(cp: AgentCheckpoint) -> list[Any]:
    return [cp.run_id, cp.status, cp.step_index, len(cp.messages), cp.usage.total_tokens, when(cp.created_at)]


SUMMARY_HEADERS = ["RUN", "STATUS", "STEP", "MESSAGES", "TOKENS", "SAVED"]


def summary_json(cp: AgentCheckpoint) -> dict[str, Any]:
    return {
        "run_id": cp.run_id,
        "status": cp.status,
        "step_index": cp.step_index,
        "messages": len(cp.messages),
        "usage": cp.usage.to_dict(),
        "created_at": cp.created_at,
    }


def message_lines(index: int, message: Message, full: bool = False) -> list[str]:
    """A message as transcript lines: ``#3 assistant  text``, then one line per tool call or result."""
    width = 10**9 if full else WIDTH
    head = f"#{index:<3} {message['role']:<9}  "
    pad = " " * len(head)
    lines: list[str] = []
    for part in content_parts(message):
        if part["type"] == "text":  # compared on `part` itself, so that mypy narrows the part's type
            line = cut(part["text"], width)
        elif part["type"] == "tool-call":
            line = f"-> {part['tool_name']} {cut(brief(part['input']), width)}  [{part['tool_call_id']}]"
        elif part["type"] == "tool-result":
            mark = "error " if part.get("is_error") else ""
            line = f"<- {part['tool_name']} [{part['tool_call_id']}] {mark}{cut(brief(part['output']), width)}"
        elif part["type"] == "tool-approval-request":
            line = f"awaiting approval {part['approval_id']} for [{part['tool_call_id']}]"
        else:
            data = part.get("data")
            size = len(data) if isinstance(data, (bytes, bytearray)) else "?"
            line = f"[{part['type']} {part.get('media_type', '')} {size} bytes]"
        lines.append((head if not lines else pad) + line)
    return lines or [head.rstrip()]


def approval_rows(requests: Sequence[ToolApprovalRequest]) -> list[list[Any]]:
    return [
        [r.approval_id, r.tool_name, r.tool_call_id, brief(r.input), "/".join(r.agent_path or ()) or "-",
         "yes" if r.token else "no"]
        for r in requests
    ]


APPROVAL_HEADERS = ["APPROVAL", "TOOL", "CALL", "INPUT", "AGENT", "SIGNED"]
