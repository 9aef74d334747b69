"""Agent factories for the CLI tests (`--agent cli_agent:...`): a pay tool that needs approval.

The pay tool appends to the file named by ``CLI_LEDGER``, so a test sees how often it ran.
"""

from __future__ import annotations

import os
from typing import Any

from durable_agent import Agent, DurableOptions, ScriptedModel, Tool, call, reply


def _pay(args: Any) -> str:
    with open(os.environ["CLI_LEDGER"], "a", encoding="utf-8") as ledger:
        ledger.write(f"paid {args['id']}\n")
    return "paid"


def tools() -> dict[str, Tool]:
    return {
        "lookup": Tool(description="Find an invoice.", parameters={"type": "object"},
                       execute=lambda args: {"id": args["id"], "amount": 42, "scan": b"\x00\xffPDF"}),
        "pay": Tool(description="Pay an invoice.", parameters={"type": "object"}, execute=_pay, needs_approval=True),
    }


def model(delay: float = 0.0) -> ScriptedModel:
    return ScriptedModel([reply("Looking it up.", call("lookup", {"id": "inv-7"})),
                          reply("Paying it.", call("pay", {"id": "inv-7"})), "Invoice inv-7 is paid."], delay=delay)


def resume_options() -> dict[str, Any]:
    """For a run in a store: the options of `resume_from_checkpoint`."""
    return {"model": model(), "tools": tools(), "max_steps": 5}


def journal_agent() -> Agent:
    """For an Agent's run on the SQLite runtime named by ``CLI_JOURNAL`` (encrypted under ``DURABLE_AGENT_KEYS`` when
    set, as a deployment's server opens it)."""
    from durable_agent.backends.sqlite import SqliteRuntime
    from durable_agent.encryption import Keyring

    keyring = Keyring.from_env() if os.environ.get("DURABLE_AGENT_KEYS") else None
    runtime = SqliteRuntime(os.environ["CLI_JOURNAL"], encryption=keyring)
    return Agent(model=model(), tools=tools(), durable=DurableOptions(runtime),
                 session_id="chat-1", max_steps=5)


def not_an_agent() -> int:
    return 42


def _no_key(request: Any) -> Any:
    from durable_agent import ConfigurationError

    raise ConfigurationError("the model needs an API key: set PROVIDER_API_KEY")


def misconfigured_options() -> dict[str, Any]:
    """A model whose call raises `ConfigurationError`, as a provider adapter without its key does."""
    return {"model": ScriptedModel(_no_key), "tools": tools(), "max_steps": 5}


def misconfigured_factory() -> Agent:
    """A factory that raises `ConfigurationError` itself, as building a provider model without its key does."""
    from durable_agent import ConfigurationError

    raise ConfigurationError("the model needs an API key: set PROVIDER_API_KEY")


def slow_resume_options() -> dict[str, Any]:
    """`resume_options` with a model that takes its time, as a real one does."""
    return {**resume_options(), "model": model(delay=0.05)}
