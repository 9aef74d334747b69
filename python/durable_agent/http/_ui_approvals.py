"""The verdicts ``useChat``'s ``addToolApprovalResponse`` sends back, read from the assistant UI message.

After ``addToolApprovalResponse({id, approved, reason})`` the ``ai`` package (6/7) sets the tool
part of the approval request (``tool-<name>`` or ``dynamic-tool``) to state
``approval-responded`` with ``approval: {id, approved, reason, signature}``, keeping the
``signature`` the stream's ``tool-approval-request`` chunk carried (the signed approval token),
and its next ``POST /chat`` carries the messages with that part (``sendAutomaticallyWhen:
lastAssistantMessageIsCompleteWithApprovalResponses``, or the app's own ``sendMessage()``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["UiVerdict", "ui_tool_approvals"]


@dataclass(frozen=True, slots=True)
class UiVerdict:
    """One approval's verdict as the UI sends it: `token` is the approval's ``signature`` (None when unsigned)."""

    approval_id: str
    approved: bool
    reason: str | None
    token: str | None


def ui_tool_approvals(message: Mapping[str, Any]) -> list[UiVerdict]:
    """The verdicts in the tool parts of an AI SDK UI message in state ``approval-responded``, one per approval id."""
    out: dict[str, UiVerdict] = {}
    for part in message.get("parts") or ():
        if not isinstance(part, dict) or part.get("state") != "approval-responded":
            continue
        kind, approval = part.get("type"), part.get("approval")
        if not (isinstance(kind, str) and kind.startswith(("tool-", "dynamic-tool")) and isinstance(approval, dict)):
            continue
        approval_id, approved = approval.get("id"), approval.get("approved")
        if not isinstance(approval_id, str) or not isinstance(approved, bool) or approval_id in out:
            continue
        reason, token = approval.get("reason"), approval.get("signature")
        out[approval_id] = UiVerdict(approval_id, approved, reason if isinstance(reason, str) else None,
                                     token if isinstance(token, str) else None)
    return list(out.values())
