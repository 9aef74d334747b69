"""The unbreakable chatbot: durable-agent in the browser, checkpointing into IndexedDB.

Runs inside Pyodide in the page (see app.js, which loads this module). Four parts:

* `IndexedDBCheckpointStore` — a `CheckpointStore` whose checkpoints live in the browser's
  IndexedDB, reached through the JS bridge (the JS module `demo_idb`, see idb.js). It stores
  the codec text of `serialize_checkpoint`, so bytes in a history survive a reload.
* The scenario — the scripted "coding assistant" of the repo's crash demo, with tools that
  take a moment (so a reload can land mid-step) and record every side effect in an
  IndexedDB ledger; `deploy` needs a human's approval.
* A real model: the package's `OpenAIChatModel` (any OpenAI-compatible ``/chat/completions``
  endpoint, streamed) over the browser's `fetch` (`FetchTransport`), so it obeys the page's CORS rules.
* `DemoController` — what the page's buttons call: start a run, pick up whatever run is in
  storage when the page (re)loads, approve or deny a pending tool call.

The approval signer's secret is generated at first load and kept in IndexedDB, so tokens
survive reloads. That is a demo shortcut: in a real deployment the secret lives on a server
and never reaches a browser (docs/trust-boundary.md in the repo).
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import demo_agent
from demo_agent import FILES, PROMPT  # noqa: F401  # PROMPT is read by app.js as demo_app.PROMPT

from durable_agent import (
    AgentCheckpoint,
    ApprovalSigner,
    ScriptedModel,
    Tool,
    ToolApprovalResponse,
    deserialize_checkpoint,
    resume_stream_from_checkpoint,
    serialize_checkpoint,
    stream_chat,
)
from durable_agent.providers import FetchTransport, OpenAIChatModel

MAX_STEPS = 12


# --------------------------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------------------------


class IndexedDBCheckpointStore:
    """A `CheckpointStore` over IndexedDB, via an object with async `get/put/remove/keys`.

    `idb` is the JS module `demo_idb` (idb.js) in the browser; every method awaits a JS
    Promise. Values are the codec text of `serialize_checkpoint` ("latest save wins").
    """

    STORE = "checkpoints"

    def __init__(self, idb: Any) -> None:
        self._idb = idb

    async def save(self, checkpoint: AgentCheckpoint) -> None:
        await self._idb.put(self.STORE, checkpoint.run_id, serialize_checkpoint(checkpoint))

    async def load(self, run_id: str) -> AgentCheckpoint | None:
        text = await self._idb.get(self.STORE, run_id)
        return None if text is None else deserialize_checkpoint(text)

    async def delete(self, run_id: str) -> None:
        await self._idb.remove(self.STORE, run_id)

    async def list(self) -> list[str]:
        keys = await self._idb.keys(self.STORE)
        return sorted(str(k) for k in (keys.to_py() if hasattr(keys, "to_py") else keys))


# --------------------------------------------------------------------------------------------
# The scenario: a scripted coding assistant whose tools take a moment and leave a ledger
# --------------------------------------------------------------------------------------------

def scripted_model(delay: float = 0.05) -> ScriptedModel:
    """The scripted model of the crash demo (examples/demo_agent.py, bundled by build.mjs): text streams
    word by word (`delay` seconds a word)."""
    return demo_agent.model(delay)


def demo_tools(record: Callable[[str, Any], Any], tool_seconds: float = 0.6) -> dict[str, Tool]:
    """The tools. Each takes `tool_seconds` and awaits `record(name, input)` (the ledger)."""

    def effect(name: str, result: Any) -> Callable[[Any], Any]:
        async def execute(args: Any) -> Any:
            await asyncio.sleep(tool_seconds)
            await record(name, args)
            return FILES.get(args.get("path", ""), "no such file") if result is None else result

        return execute

    path_schema = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    return {
        "read_file": Tool(description="Read a file of the repository.", parameters=path_schema,
                          execute=effect("read_file", None)),
        "write_file": Tool(description="Apply a patch to a file.",
                           parameters={"type": "object",
                                       "properties": {"path": {"type": "string"}, "patch": {"type": "string"}},
                                       "required": ["path", "patch"]},
                           execute=effect("write_file", "patched 1 line")),
        "run_tests": Tool(description="Run the tests.",
                          parameters={"type": "object", "properties": {"target": {"type": "string"}}},
                          execute=effect("run_tests", "1 passed in 0.02s")),
        "deploy": Tool(description="Deploy a service to production (needs a human's approval).",
                       parameters={"type": "object",
                                   "properties": {"service": {"type": "string"}, "version": {"type": "string"}}},
                       execute=effect("deploy", "auth 1.4.2 is live"), needs_approval=True),
    }


# --------------------------------------------------------------------------------------------
# What the page shows: a transcript derived from the stored history
# --------------------------------------------------------------------------------------------


def transcript(messages: Any) -> list[dict[str, Any]]:
    """The history as display entries (no random ids, so two runs of the script compare equal)."""
    entries: list[dict[str, Any]] = []
    for message in messages:
        role, content = message["role"], message["content"]
        if isinstance(content, str):
            entries.append({"role": role, "kind": "text", "text": content})
            continue
        for part in content:
            kind = part.get("type")
            if kind == "text" and part.get("text"):
                entries.append({"role": role, "kind": "text", "text": part["text"]})
            elif kind == "tool-call":
                entries.append({"role": role, "kind": "tool-call", "tool": part["tool_name"],
                                "text": json.dumps(part.get("input"), sort_keys=True)})
            elif kind == "tool-approval-request":
                entries.append({"role": role, "kind": "approval", "text": "asked for a human's approval"})
            elif kind == "tool-result":
                output = part.get("output")
                entries.append({"role": role, "kind": "tool-error" if part.get("is_error") else "tool-result",
                                "tool": part.get("tool_name"),
                                "text": output if isinstance(output, str) else json.dumps(output, sort_keys=True)})
    return entries


# --------------------------------------------------------------------------------------------
# The controller the page drives
# --------------------------------------------------------------------------------------------


class DemoController:
    """Owns the store, the signer and the running leg; reports to `ui` (JS callbacks, JSON text).

    `ui` has: `status(json)`, `part(json)`, `render(json)`. `render` receives the whole view
    (transcript from the stored checkpoint, run status, pending approvals, ledger).
    """

    def __init__(self, idb: Any, ui: Any, *, model_delay: float = 0.05, tool_seconds: float = 0.6) -> None:
        self.idb = idb
        self.ui = ui
        self.store = IndexedDBCheckpointStore(idb)
        self.model_delay = model_delay
        self.tool_seconds = tool_seconds
        self.signer: ApprovalSigner | None = None
        self.running: asyncio.Task[Any] | None = None
        self.busy = False  # a leg is being driven right now
        self.api_key = ""  # a real endpoint's key: kept in memory and sessionStorage only (app.js)

    # -- setup ------------------------------------------------------------------------------

    async def boot(self) -> str:
        """Load or create the approval secret, then pick up the active run, if any."""
        secret_b64 = await self.idb.get("meta", "approval_secret")
        if secret_b64 is None:
            secret_b64 = base64.b64encode(secrets.token_bytes(32)).decode("ascii")
            await self.idb.put("meta", "approval_secret", secret_b64)
        self.signer = ApprovalSigner(base64.b64decode(secret_b64))
        return await self.pick_up()

    async def _meta_json(self, key: str) -> Any:
        text = await self.idb.get("meta", key)
        return None if text is None else json.loads(text)

    async def _record(self, tool: str, args: Any) -> None:
        run = await self._meta_json("active_run")
        await self.idb.append("effects", json.dumps({"run_id": run and run["run_id"], "tool": tool, "input": args}))

    def _model(self, config: Mapping[str, Any]) -> Any:
        if config.get("kind") == "openai":
            if not self.api_key and not config.get("no_key"):
                raise RuntimeError("this run uses a real model endpoint: enter its API key to continue")
            return OpenAIChatModel(config["model"], base_url=config["base_url"], api_key=self.api_key,
                                   transport=FetchTransport())
        return scripted_model(self.model_delay)

    def _options(self, config: Mapping[str, Any]) -> dict[str, Any]:
        return {"model": self._model(config), "tools": demo_tools(self._record, self.tool_seconds),
                "max_steps": MAX_STEPS, "approval_signer": self.signer}

    # -- the view ---------------------------------------------------------------------------

    async def view(self, note: str = "") -> dict[str, Any]:
        run = await self._meta_json("active_run")
        effects = json.loads(await self.idb.valuesJson("effects"))
        view: dict[str, Any] = {"run_id": None, "status": "idle", "step_index": None, "entries": [],
                                "pending": [], "effects": [json.loads(e) for e in effects], "note": note,
                                "usage": None, "model": None, "busy": self.busy}
        if run is None:
            return view
        view["run_id"] = run["run_id"]
        view["model"] = run["model"].get("kind", "scripted")
        checkpoint = await self.store.load(run["run_id"])
        if checkpoint is None:
            view["status"] = "starting"
            view["entries"] = transcript([{"role": "user", "content": run["prompt"]}])
            return view
        view["status"] = checkpoint.status
        view["step_index"] = checkpoint.step_index
        view["entries"] = transcript(checkpoint.messages)
        view["usage"] = checkpoint.usage.total_tokens
        view["pending"] = [
            {"approval_id": r.approval_id, "tool_name": r.tool_name, "input": r.input}
            for r in checkpoint.pending_approvals or ()
        ]
        return view

    async def render(self, note: str = "") -> None:
        self.ui.render(json.dumps(await self.view(note)))

    # -- driving a leg ----------------------------------------------------------------------

    async def _drive(self, result: Any) -> None:
        note = ""
        try:
            async for part in result.full_stream:
                kind = part.type
                if kind == "text-delta":
                    self.ui.part(json.dumps({"type": kind, "text": part.text}))
                elif kind in ("step-start", "tool-call", "tool-result", "tool-approval-request"):
                    self.ui.part(json.dumps({k: v for k, v in part.to_dict().items() if k in
                                             ("type", "tool_name", "input", "output", "is_error")
                                             or (k == "step_index" and kind == "step-start")},
                                            default=str))
                elif kind == "step-finish":
                    await self.render()  # the checkpoint of this step is stored: show it
                elif kind == "error":
                    note = f"error: {type(part.error).__name__}: {part.error}"
        except Exception as exc:  # noqa: BLE001 - surfaced on the page, never swallowed silently
            note = f"error: {type(exc).__name__}: {exc}"
        finally:
            self.busy = False
        await self.render(note)

    def _spawn(self, result: Any) -> None:
        self.busy = True
        self.running = asyncio.ensure_future(self._drive(result))

    async def start(self, prompt: str, model_json: str) -> None:
        """Start a new run (the previous one, if any, is forgotten by the page, not deleted)."""
        if self.busy:
            raise RuntimeError("a run is already in progress")
        config = json.loads(model_json)
        run_id = uuid.uuid4().hex
        # Written before the first checkpoint, so a reload during step 0 can start the run again.
        await self.idb.put("meta", "active_run", json.dumps({"run_id": run_id, "prompt": prompt, "model": config}))
        await self.render()
        self._spawn(stream_chat(messages=[{"role": "user", "content": prompt}],
                                store=self.store, run_id=run_id, **self._options(config)))

    async def pick_up(self) -> str:
        """After a (re)load: continue the active run from its last stored step, or just show it."""
        run = await self._meta_json("active_run")
        if run is None:
            await self.render()
            return "idle"
        checkpoint = await self.store.load(run["run_id"])
        try:
            options = self._options(run["model"])
        except RuntimeError as exc:
            await self.render(str(exc))
            return "needs-key"
        if checkpoint is None:
            # The page went away during the first step: nothing was stored yet, so run it again.
            await self.render("restarted: the page closed before the first step was stored")
            self._spawn(stream_chat(messages=[{"role": "user", "content": run["prompt"]}],
                                    store=self.store, run_id=run["run_id"], **options))
            return "restarted"
        if checkpoint.status == "running":
            await self.render(f"resumed from storage after step {checkpoint.step_index + 1}")
            self._spawn(resume_stream_from_checkpoint(self.store, run["run_id"], **options))
            return "resumed"
        await self.render()
        return checkpoint.status

    async def answer(self, approval_id: str, approved: bool) -> None:
        """A human's verdict on a pending tool call: resume the run with it (signed token attached)."""
        if self.busy:
            raise RuntimeError("a run is already in progress")
        run = await self._meta_json("active_run")
        if run is None:
            raise RuntimeError("no active run")
        checkpoint = await self.store.load(run["run_id"])
        pending = {r.approval_id: r for r in ((checkpoint.pending_approvals or ()) if checkpoint else ())}
        if approval_id not in pending:
            await self.render("that approval is no longer pending")
            return
        request = pending[approval_id]
        response = ToolApprovalResponse(approval_id, approved, reason=None if approved else "Denied by the user.",
                                        token=request.token)
        await self.render("approved: resuming" if approved else "denied: resuming")
        self._spawn(resume_stream_from_checkpoint(self.store, run["run_id"], approval_responses=[response],
                                                  **self._options(run["model"])))

    async def forget(self) -> None:
        """Forget the active run (its checkpoint stays in IndexedDB)."""
        if self.running is not None and not self.running.done():
            self.running.cancel()
        await self.idb.remove("meta", "active_run")
        await self.render()
