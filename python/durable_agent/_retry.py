"""`RetryPolicy`: how long to wait before the next attempt of a failed model call, as a pure function.

The policy is exponential backoff with full jitter (a uniformly random wait between 0 and
the capped exponential delay), and it honours a provider's ``Retry-After`` when the error
carries one: the wait is then at least what the provider asked for. The rules, in order:

1. The error is not retryable (its ``retryable`` attribute is not True): give up.
2. `attempt` attempts have been made and the policy allows no more: give up.
3. The backoff is ``min(max_delay_ms, initial_delay_ms * multiplier ** (attempt - 1))``,
   times ``random()`` when `jitter` is on.
4. With `honour_retry_after`, a ``retry_after_ms`` on the error raises the wait to at least
   that; a ``retry_after_ms`` beyond `max_retry_after_ms` gives up instead of waiting that long.

`delay_ms` reads only its arguments (the random source is passed in), so a durable runtime can
store the decision and a replayed run decides the same way.

`sleep`, when set, takes the wait instead of the event loop (or a durable runtime's timer): it
is awaited with the wait in milliseconds. A test of 429 handling passes one that records the
wait and returns at once.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from ._errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Retries of a failed model call. `attempts` counts every attempt, the first one included.
    Times are milliseconds; `sleep(ms)` replaces the wait itself (see the module docstring)."""

    attempts: int = 4
    initial_delay_ms: int = 500
    max_delay_ms: int = 30_000
    multiplier: float = 2.0
    jitter: bool = True
    honour_retry_after: bool = True
    max_retry_after_ms: int = 120_000
    sleep: Callable[[int], Awaitable[object]] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ConfigurationError("RetryPolicy attempts must be at least 1")
        if self.initial_delay_ms < 0 or self.max_delay_ms < self.initial_delay_ms:
            raise ConfigurationError("RetryPolicy needs 0 <= initial_delay_ms <= max_delay_ms")
        if self.multiplier < 1:
            raise ConfigurationError("RetryPolicy multiplier must be at least 1")
        if self.max_retry_after_ms < 0:
            raise ConfigurationError("RetryPolicy max_retry_after_ms must not be negative")

    def delay_ms(self, attempt: int, error: BaseException, random: Callable[[], float]) -> int | None:
        """The wait in ms before attempt ``attempt + 1``, after attempt `attempt` (1-based) failed
        with `error`; None to give up. See the module docstring for the rules."""
        if getattr(error, "retryable", None) is not True:
            return None
        if attempt >= self.attempts:
            return None
        backoff = min(float(self.max_delay_ms), self.initial_delay_ms * self.multiplier ** (attempt - 1))
        if self.jitter:
            backoff *= random()
        wait = int(backoff)
        retry_after = getattr(error, "retry_after_ms", None)
        if self.honour_retry_after and isinstance(retry_after, int) and not isinstance(retry_after, bool):
            if retry_after > self.max_retry_after_ms:
                return None
            wait = max(wait, retry_after)
        return wait
