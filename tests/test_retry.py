"""RetryPolicy.delay_ms: full-jitter exponential backoff that honours Retry-After, as a pure function."""

from __future__ import annotations

import pytest

from durable_agent import ConfigurationError, ModelCallError, RetryPolicy


def failure(retryable: bool = True, retry_after_ms: int | None = None) -> ModelCallError:
    return ModelCallError("x", provider="p", kind="rate_limited", retryable=retryable, retry_after_ms=retry_after_ms)


def test_exponential_without_jitter_capped_at_max_delay() -> None:
    policy = RetryPolicy(attempts=10, initial_delay_ms=100, max_delay_ms=1000, multiplier=3, jitter=False)
    assert [policy.delay_ms(n, failure(), lambda: 0.5) for n in range(1, 10)] == [
        100, 300, 900, 1000, 1000, 1000, 1000, 1000, 1000]
    assert policy.delay_ms(10, failure(), lambda: 0.5) is None


def test_full_jitter_scales_the_backoff_by_the_random_draw() -> None:
    policy = RetryPolicy(attempts=5, initial_delay_ms=400, multiplier=2)
    assert policy.delay_ms(2, failure(), lambda: 0.25) == 200
    assert policy.delay_ms(2, failure(), lambda: 0.0) == 0
    assert policy.delay_ms(2, failure(), lambda: 0.999) == 799


def test_retry_after_is_a_floor_and_an_excessive_one_gives_up() -> None:
    policy = RetryPolicy(attempts=5, initial_delay_ms=100, max_retry_after_ms=60_000)
    assert policy.delay_ms(1, failure(retry_after_ms=19_500), lambda: 1.0) == 19_500
    assert policy.delay_ms(1, failure(retry_after_ms=10), lambda: 1.0) == 100
    assert policy.delay_ms(1, failure(retry_after_ms=61_000), lambda: 1.0) is None
    ignoring = RetryPolicy(attempts=5, initial_delay_ms=100, honour_retry_after=False, jitter=False)
    assert ignoring.delay_ms(1, failure(retry_after_ms=19_500), lambda: 1.0) == 100


def test_errors_that_are_not_retryable_give_up_at_once() -> None:
    policy = RetryPolicy()
    assert policy.delay_ms(1, failure(retryable=False), lambda: 0.5) is None
    assert policy.delay_ms(1, ValueError("not a provider error"), lambda: 0.5) is None
    assert RetryPolicy(attempts=1).delay_ms(1, failure(), lambda: 0.5) is None


@pytest.mark.parametrize("options", [{"attempts": 0}, {"initial_delay_ms": 5, "max_delay_ms": 1},
                                     {"multiplier": 0.5}, {"max_retry_after_ms": -1}])
def test_invalid_policies_are_refused(options: dict[str, int]) -> None:
    with pytest.raises(ConfigurationError):
        RetryPolicy(**options)  # type: ignore[arg-type]
