"""The memory runtime passes the durable-runtime conformance suite; step keys round-trip."""

from __future__ import annotations

from typing import Any

import pytest

from durable_agent import MODEL_CALL, ConfigurationError, StepKeyError, nested_call, parse_step_key, step_key
from durable_agent.backends.memory import MemoryDurableState, MemoryRuntime
from durable_agent.testing.runtime_conformance import DurableRuntimeConformance


class TestMemoryRuntime(DurableRuntimeConformance):
    @pytest.fixture
    def make_runtime(self) -> Any:
        state = MemoryDurableState()
        return lambda clock: MemoryRuntime(state=state, clock=clock)


async def test_clone_is_independent() -> None:
    runtime = MemoryRuntime()
    await runtime.stores.queue.write("s", [1])
    copy = runtime.state.clone()
    await runtime.stores.queue.write("s", [2])
    assert copy.queues["s"] == [1] and runtime.state.queues["s"] == [2]


def test_one_constructor_a_fresh_state_by_default_or_one_shared_by_several_runtimes() -> None:
    alone, other = MemoryRuntime(), MemoryRuntime()
    assert alone.state is not other.state
    shared = MemoryDurableState()
    first, second = MemoryRuntime(shared), MemoryRuntime(state=shared)
    assert first.state is shared and second.stores.checkpoints is first.stores.checkpoints
    assert first.owner.token != second.owner.token  # two "processes" on one database


def test_a_state_of_another_type_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="MemoryDurableState"):
        MemoryRuntime({})  # type: ignore[arg-type]


@pytest.mark.parametrize("run", ["r", "run:with:colons", "100%", "%3A", "ünï ☃", "a/b"])
@pytest.mark.parametrize("call", [MODEL_CALL, "toolu_01:x", nested_call("cm1", 2), "%25"])
def test_step_keys_round_trip_any_run_and_call(run: str, call: str) -> None:
    key = step_key(run, 7, call, 2)
    assert parse_step_key(key) == (run, 7, call, 2)
    assert key.count(":") == 3
    prefix = key[: key.index(":") + 1]  # the run's field: what a store scans to find the run's keys
    for other in ("r", "run", "run:with", "100", "%3A:"):  # no other run's keys share the prefix
        assert other == run or not step_key(other, 7, call, 2).startswith(prefix)


@pytest.mark.parametrize(
    "bad", ["a:1:b", "a:1:b:0:c", "a:-1:b:0", "a:1.5:b:0", "a:01:b:0", "a:1:b:x", ":1:b:0", "a:1::0",
            "a%3a:1:b:0", "a%41:1:b:0", "a%:1:b:0", "a:1:b:٣"],
)
def test_malformed_keys_are_refused(bad: str) -> None:
    with pytest.raises(StepKeyError):
        parse_step_key(bad)


@pytest.mark.parametrize("args", [("", 0, "c", 0), ("r", -1, "c", 0), ("r", 0, "", 0), ("r", 0, "c", 1.5),
                                  ("r", True, "c", 0)])
def test_step_key_refuses_bad_parts(args: Any) -> None:
    with pytest.raises(StepKeyError):
        step_key(*args)


@pytest.mark.parametrize(("args", "named"), [(("r", -1, "c", 0), "turn -1"), (("r", 0, "c", -2), "attempt -2"),
                                             (("r", "1", "c", 0), "turn '1'"), (("r", 1, "c", False), "attempt False")])
def test_a_bad_index_is_named_with_its_value(args: Any, named: str) -> None:
    what, value = named.split(" ")
    with pytest.raises(StepKeyError, match=f"step key {what} must be a non-negative int, got {value}"):
        step_key(*args)


def test_nested_call_positions_start_at_one() -> None:
    assert nested_call("cm1", 1) == "cm1/1"
    with pytest.raises(StepKeyError):
        nested_call("cm1", 0)
