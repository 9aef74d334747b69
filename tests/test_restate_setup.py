"""`durable_agent.restate` without a server: what it refuses, and that it imports without the SDK."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from durable_agent import Agent, ConfigurationError, DurableOptions, MemoryRuntime, ScriptedModel

PYTHON_DIR = Path(__file__).resolve().parent.parent / "python"


@pytest.mark.host_only("runs a fresh interpreter in a subprocess")
def test_without_the_sdk_the_package_imports_and_serving_says_which_extra_to_install() -> None:
    probe = (
        "import sys\n"
        "sys.modules['restate'] = None  # as if restate-sdk were not installed\n"
        "import durable_agent.restate as r\n"
        "from durable_agent import Agent, FeatureUnavailableError, ScriptedModel\n"
        "try:\n"
        "    r.agent_app(Agent(model=ScriptedModel(['hi'])))\n"
        "except FeatureUnavailableError as exc:\n"
        "    print(exc.code, exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(PYTHON_DIR), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("feature_unavailable ") and "durable-agent[restate]" in done.stdout


def test_serving_refuses_a_durable_agent_a_bad_name_and_a_non_agent() -> None:
    pytest.importorskip("restate", reason="needs restate-sdk: pip install 'durable-agent[restate]'")
    from durable_agent.restate import agent_services

    model = ScriptedModel(["hi"])
    durable = Agent(model=model, durable=DurableOptions(MemoryRuntime()), session_id="s")
    with pytest.raises(ConfigurationError, match="non-durable Agent"):
        agent_services(durable)
    with pytest.raises(ConfigurationError, match="identifier"):
        agent_services(Agent(model=model), name="my agent")
    with pytest.raises(ConfigurationError, match="needs an Agent"):
        agent_services(model)  # type: ignore[arg-type]
    objects = agent_services(Agent(model=model), name="helper")
    assert [o.name for o in objects] == ["helper", "helperApprovals"]


