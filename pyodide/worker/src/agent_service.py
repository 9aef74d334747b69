"""The agent a Durable Object runs, and its small HTTP API — pure Python, no Workers import.

`entry.py` (the Worker entry point) builds one `RunService` per request around the object's
`ctx.storage` and hands it the request's method, path and body. Tests do the same with a
stand-in storage, under CPython and under Pyodide.

HTTP API of one run (one Durable Object per run id):

* ``POST /runs/{run_id}`` body ``{"prompt": "..."}`` — start the run; answers when it completed
  or suspended on an approval.
* ``GET /runs/{run_id}`` — its latest checkpoint: status, history, pending approvals (with tokens).
* ``POST /runs/{run_id}/approvals`` body ``{"approvals": [{"approval_id", "approved", "reason"?,
  "token"}]}`` — the human's verdicts; the run resumes. Verdicts without a valid token (minted by
  this deployment's secret for this very call and run) count as denials.
* ``POST /runs/{run_id}/resume`` — continue a run that stopped between steps (the object was
  evicted or redeployed mid-run). The object's alarm does this by itself.

Every answer is JSON: ``{"run_id", "status", "step_index", "text", "pending", "total_tokens"}``
or ``{"error": "..."}`` with a 4xx status.

Nothing here touches entropy at import time (Workers forbid it): run ids and approval ids are
minted inside request handlers.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from typing import Any

from durable_agent import (
    AgentCheckpoint,
    ApprovalSigner,
    ConfigurationError,
    LanguageModel,
    ScriptedModel,
    Tool,
    ToolApprovalResponse,
    call,
    generate_text,
    message_text,
    reply,
    resume_from_checkpoint,
)
from durable_agent.backends.durable_object import AsyncDurableObjectCheckpointStore
from durable_agent.encryption import Keyring
from durable_agent.providers import FetchTransport, OpenAIChatModel

MAX_STEPS = 10
HEAL_AFTER_MS = 60_000  # if a leg has not ended by then, the alarm picks the run up again
RUN_PATH = re.compile(r"^/runs/([A-Za-z0-9_.:-]{1,200})(/approvals|/resume)?/?$")


def scripted_support_model() -> ScriptedModel:
    """The agent's model in this example: a scripted support agent (no network needed).

    With an ``OPENAI_API_KEY`` secret the Worker uses a real model instead (`model_factory_from`).
    """
    return ScriptedModel(
        [
            reply("Let me look up that order.", call("lookup_order", {"order_id": "A-1001"})),
            reply("It was delivered damaged and is eligible for a refund, which needs approval.",
                  call("refund", {"order_id": "A-1001", "amount_cents": 4200})),
            "Done: 42.00 EUR refunded on order A-1001.",
        ],
        model_id="scripted-support",
    )


def model_factory_from(env: Any) -> Callable[[], LanguageModel]:
    """The model of this Worker's runs: `OpenAIChatModel` over the Worker's `fetch` when the
    ``OPENAI_API_KEY`` secret is set (``OPENAI_BASE_URL`` and ``OPENAI_MODEL`` vars optional: any
    OpenAI-compatible endpoint); the scripted support agent otherwise."""
    key = getattr(env, "OPENAI_API_KEY", None)
    if not key:
        return scripted_support_model
    base_url = getattr(env, "OPENAI_BASE_URL", None)
    name = str(getattr(env, "OPENAI_MODEL", None) or "gpt-5.5")

    def openai_model() -> LanguageModel:
        return OpenAIChatModel(name, base_url=str(base_url) if base_url else None, api_key=str(key),
                               transport=FetchTransport())

    return openai_model


def keyring_from(env: Any) -> Keyring | None:
    """The keyring of this Worker's checkpoints: the ``DURABLE_AGENT_KEYS`` secret (``"k1:<base64 32-byte key>"``,
    rotation as in the library's README, ``DURABLE_AGENT_PRIMARY_KEY`` optional), sealed through WebCrypto; None
    (checkpoints in plaintext) when the secret is not set."""
    keys = getattr(env, "DURABLE_AGENT_KEYS", None)
    if not keys:
        return None
    primary = getattr(env, "DURABLE_AGENT_PRIMARY_KEY", None)
    variables = {"DURABLE_AGENT_KEYS": str(keys), "DURABLE_AGENT_PRIMARY_KEY": str(primary) if primary else ""}
    return Keyring.from_env(variables)


def support_tools(storage: Any) -> dict[str, Tool]:
    """Two tools; `refund` needs a human's approval and records its effect in the object's storage."""

    def lookup_order(args: Any) -> Any:
        return {"order_id": args["order_id"], "status": "delivered", "damaged": True, "amount_cents": 4200}

    def refund(args: Any) -> Any:
        key = f"refund:{args['order_id']}"
        if storage.kv.get(key) is not None:  # idempotent: a re-run of this step refunds nothing twice
            return "already refunded"
        storage.kv.put(key, json.dumps({"amount_cents": args["amount_cents"]}))
        return f"refunded {args['amount_cents']} cents"

    order = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
    return {
        "lookup_order": Tool(description="Look up an order.", parameters=order, execute=lookup_order),
        "refund": Tool(
            description="Refund an order (needs a human's approval).",
            parameters={"type": "object",
                        "properties": {"order_id": {"type": "string"}, "amount_cents": {"type": "integer"}},
                        "required": ["order_id", "amount_cents"]},
            execute=refund,
            needs_approval=True,
        ),
    }


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _summary(checkpoint: AgentCheckpoint) -> dict[str, Any]:
    last = next((m for m in reversed(checkpoint.messages) if m["role"] == "assistant"), None)
    return {
        "run_id": checkpoint.run_id,
        "status": checkpoint.status,
        "step_index": checkpoint.step_index,
        "text": message_text(last) if last is not None else "",
        "pending": [r.to_dict() for r in checkpoint.pending_approvals or ()],
        "total_tokens": checkpoint.usage.total_tokens,
    }


class RunService:
    """Runs agent legs against one Durable Object's storage."""

    def __init__(
        self,
        storage: Any,
        *,
        secret: str | bytes | None,
        model_factory: Callable[[], LanguageModel] = scripted_support_model,
        clock: Callable[[], int] | None = None,
        encryption: Keyring | None = None,
    ) -> None:
        if not secret:
            raise ConfigurationError(
                "APPROVAL_SECRET is not set: run `npx wrangler secret put APPROVAL_SECRET` with at least 32 random "
                "bytes (python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        self.storage = storage
        # The async face: with a keyring it seals through WebCrypto, which a Worker has (no cryptography needed).
        self.store = AsyncDurableObjectCheckpointStore(storage, encryption=encryption)
        self.encryption = encryption
        self.signer = ApprovalSigner(secret)
        self.model_factory = model_factory
        self.clock = clock or (lambda: int(time.time() * 1000))

    def _options(self) -> dict[str, Any]:
        return {"model": self.model_factory(), "tools": support_tools(self.storage), "max_steps": MAX_STEPS,
                "approval_signer": self.signer}

    async def _leg(self, run: Callable[[], Any], run_id: str) -> dict[str, Any]:
        # An alarm is the safety net: if this object dies mid-leg, the alarm resumes the run.
        await self.storage.setAlarm(self.clock() + HEAL_AFTER_MS)
        await run()
        await self.storage.deleteAlarm()
        checkpoint = await self.store.load(run_id)
        if checkpoint is None:  # a run without tools calls does not checkpoint; ours always has tools
            raise HttpError(500, f"run {run_id} stored no checkpoint")
        return _summary(checkpoint)

    async def start(self, run_id: str, prompt: str) -> dict[str, Any]:
        if await self.store.load(run_id) is not None or self.storage.kv.get(f"prompt:{run_id}") is not None:
            raise HttpError(409, f"run {run_id} already exists")
        # lets the alarm restart a run lost in its first step (sealed like the checkpoints when they are)
        self.storage.kv.put(f"prompt:{run_id}", await self._stored_prompt(run_id, prompt))
        return await self._leg(lambda: generate_text(messages=[{"role": "user", "content": prompt}],
                                                     store=self.store, run_id=run_id, **self._options()), run_id)

    async def resume(self, run_id: str, approvals: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        checkpoint = await self.store.load(run_id)
        if checkpoint is None:
            prompt = await self._prompt(run_id)
            if prompt is None:
                raise HttpError(404, f"no run {run_id}")
            return await self._leg(lambda: generate_text(messages=[{"role": "user", "content": prompt}],
                                                         store=self.store, run_id=run_id, **self._options()),
                                   run_id)
        if checkpoint.status == "completed":
            return _summary(checkpoint)
        responses = [
            ToolApprovalResponse(str(a["approval_id"]), bool(a["approved"]), reason=a.get("reason"),
                                 token=a.get("token"))
            for a in approvals or ()
        ]
        return await self._leg(lambda: resume_from_checkpoint(self.store, run_id, approval_responses=responses,
                                                              **self._options()), run_id)

    async def _stored_prompt(self, run_id: str, prompt: str) -> str:
        if self.encryption is None:
            return prompt
        return await self.encryption.seal_async(prompt, ("worker-prompt", run_id))

    async def _prompt(self, run_id: str) -> str | None:
        stored = self.storage.kv.get(f"prompt:{run_id}")
        if stored is None or self.encryption is None:
            return None if stored is None else str(stored)
        return str(await self.encryption.open_async(stored, ("worker-prompt", run_id)))

    async def heal(self) -> list[dict[str, Any]]:
        """The alarm: continue every run of this object that stopped mid-way (status running)."""
        healed = [await self.resume(run_id) for run_id in await self.store.list(status="running")]
        for key, _ in self.storage.kv.list(prefix="prompt:"):
            run_id = key[len("prompt:"):]
            if await self.store.load(run_id) is None:
                healed.append(await self.resume(run_id))
        return healed

    async def handle(self, method: str, path: str, body: str) -> tuple[int, dict[str, Any]]:
        """Route one request; returns (HTTP status, JSON-ready payload)."""
        try:
            match = RUN_PATH.match(path)
            if match is None:
                raise HttpError(404, f"no route for {path}")
            run_id, action = match.group(1), match.group(2)
            data = json.loads(body) if body else {}
            if not isinstance(data, dict):
                raise HttpError(400, "the body must be a JSON object")
            if method == "GET" and action is None:
                checkpoint = await self.store.load(run_id)
                if checkpoint is None:
                    raise HttpError(404, f"no run {run_id}")
                return 200, _summary(checkpoint)
            if method == "POST" and action is None:
                prompt = data.get("prompt")
                if not isinstance(prompt, str) or not prompt.strip():
                    raise HttpError(400, 'POST /runs/{id} needs {"prompt": "..."}')
                return 200, await self.start(run_id, prompt)
            if method == "POST" and action == "/approvals":
                approvals = data.get("approvals")
                if not isinstance(approvals, list) or not all(
                    isinstance(a, dict) and "approval_id" in a and "approved" in a for a in approvals
                ):
                    raise HttpError(400, 'needs {"approvals": [{"approval_id", "approved", "token"}]}')
                return 200, await self.resume(run_id, approvals)
            if method == "POST" and action == "/resume":
                return 200, await self.resume(run_id)
            raise HttpError(405, f"{method} not allowed on {path}")
        except HttpError as exc:
            return exc.status, {"error": str(exc)}
        except ValueError as exc:  # malformed JSON body, bad ids
            return 400, {"error": f"{type(exc).__name__}: {exc}"}
