"""Stop conditions: when a run should stop after a step even though the model wants to go on.

A condition is any callable taking a `StopContext` and returning True to stop. Budget
conditions see the whole run's usage (every leg since the run started), so a run resumed
from a checkpoint cannot overspend by starting each leg from zero.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from ._checkpoint import Usage
from ._errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class StopContext:
    """What a stop condition sees after a step."""

    step_count: int  # steps taken by this call (this leg)
    usage: Usage  # cumulative usage of the whole run
    leg_usage: Usage  # usage of this call only
    model_id: str


StopCondition = Callable[[StopContext], bool]


@dataclass(frozen=True, slots=True)
class ModelPrice:
    """Prices in currency units per million tokens."""

    input_per_million: float
    output_per_million: float

    def cost(self, usage: Usage) -> float:
        return (usage.input_tokens * self.input_per_million + usage.output_tokens * self.output_per_million) / 1e6


def step_count_is(count: int) -> StopCondition:
    """Stop once this call has taken `count` steps."""
    if count < 1:
        raise ConfigurationError("step_count_is needs a count of at least 1")
    return lambda ctx: ctx.step_count >= count


def total_tokens_exceed(limit: int) -> StopCondition:
    """Stop once the whole run has used more than `limit` tokens."""
    return lambda ctx: ctx.usage.total_tokens > limit


def cost_exceeds(limit: float, prices: Mapping[str, ModelPrice]) -> StopCondition:
    """Stop once the whole run's cost passes `limit`, priced with the current model's entry in `prices`.

    A model missing from `prices` is a `ConfigurationError`: a budget that silently never
    fires is worse than a run that stops with a clear error.
    """

    def exceeded(ctx: StopContext) -> bool:
        price = prices.get(ctx.model_id)
        if price is None:
            raise ConfigurationError(f"cost_exceeds has no price for model {ctx.model_id!r}")
        return price.cost(ctx.usage) > limit

    return exceeded
