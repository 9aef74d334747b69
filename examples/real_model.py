"""The README's tour against a live model: a tool call, an approval, a resume from the stored checkpoint.

    OPENAI_API_KEY=sk-...    python examples/real_model.py     # OpenAI (gpt-5.5, or OPENAI_MODEL)
    OPENAI_BASE_URL=http://localhost:11434/v1 OPENAI_API_KEY=none OPENAI_MODEL=llama3.1 python examples/real_model.py
    ANTHROPIC_API_KEY=sk-ant-... python examples/real_model.py # Anthropic (claude-sonnet-5-5, or ANTHROPIC_MODEL)

Without any of those keys it prints that it was skipped and exits 0. A real model decides for
itself: it may pay at once (the run then suspends for your approval, granted here), or only look
the invoice up; the script reports what happened either way.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "python"))

from durable_agent import (
    InMemoryCheckpointStore,
    LanguageModel,
    ModelCallError,
    Tool,
    ToolApprovalResponse,
    generate_text,
    resume_from_checkpoint,
)
from durable_agent.providers import AnthropicModel, OpenAIChatModel

INVOICE = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


def live_model() -> LanguageModel | None:
    """A model from the environment, or None when no provider key is set."""
    if os.environ.get("ANTHROPIC_API_KEY"):
        return AnthropicModel(os.environ.get("ANTHROPIC_MODEL", "claude-sonnet-5-5"))
    if os.environ.get("OPENAI_API_KEY"):
        return OpenAIChatModel(os.environ.get("OPENAI_MODEL", "gpt-5.5"))
    return None


async def tour(model: LanguageModel) -> None:
    paid: list[str] = []

    def pay(args: Any) -> str:
        paid.append(args["id"])
        return "paid"

    tools = {
        "lookup": Tool(description="Find an invoice by id.", parameters=INVOICE,
                       execute=lambda args: {"id": args["id"], "amount": 42, "currency": "EUR"}),
        "pay": Tool(description="Pay an invoice by id.", parameters=INVOICE, execute=pay, needs_approval=True),
    }
    store = InMemoryCheckpointStore()
    first = await generate_text(
        model=model, tools=tools, max_steps=6, store=store, run_id="run-42",
        messages=[{"role": "user", "content": "Look up invoice inv-7, then pay it."}],
    )
    print(f"[{model.model_id}] first leg: {first.finish_reason}; tokens {first.usage.total_tokens}")
    if first.finish_reason != "suspended":
        print("the model answered without asking to pay:", first.text)
        return
    request = first.pending_approvals[0]
    print("needs approval:", request.tool_name, request.input)
    done = await resume_from_checkpoint(
        store, "run-42", model=model, tools=tools, max_steps=6,
        approval_responses=[ToolApprovalResponse(request.approval_id, approved=True)],
    )
    print(done.text, "| paid:", paid, "| tokens, whole run:", done.total_usage.total_tokens)


def main() -> int:
    model = live_model()
    if model is None:
        print("real_model.py: SKIPPED — set OPENAI_API_KEY (optionally OPENAI_BASE_URL, OPENAI_MODEL) "
              "or ANTHROPIC_API_KEY to run the tour against a live model.")
        return 0
    try:
        asyncio.run(tour(model))
    except ModelCallError as exc:
        print(f"real_model.py: the provider call failed ({exc.kind}, retryable={exc.retryable}): {exc}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
