"""The transport seam: request, response, timeouts, and the one-method Protocol."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from .._errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds (like httpx's; every other duration of the API is milliseconds, named ``*_ms``).
    `connect`: opening the connection; `read`: the longest silence between two chunks (waiting
    for the response head counts as one); `total`: the whole call, None for no limit."""

    connect: float = 10.0
    read: float = 120.0
    total: float | None = 600.0

    def __post_init__(self) -> None:
        if self.connect <= 0 or self.read <= 0 or (self.total is not None and self.total <= 0):
            raise ConfigurationError(f"timeouts must be positive seconds, got {self!r}")

    @classmethod
    def within(cls, seconds: float) -> Timeouts:
        """A whole call of at most `seconds`: the default limits, none longer than that."""
        if not isinstance(seconds, int | float) or isinstance(seconds, bool) or not seconds > 0:
            raise ConfigurationError(f"timeout must be positive seconds, got {seconds!r}")
        default = cls()
        return cls(connect=min(default.connect, seconds), read=min(default.read, seconds), total=seconds)


@dataclass(frozen=True, slots=True)
class HttpRequest:
    """A POST of `body` (JSON bytes) to `url`."""

    url: str
    headers: Mapping[str, str]
    body: bytes
    timeouts: Timeouts = Timeouts()


@dataclass(frozen=True, slots=True)
class HttpResponse:
    """The status, the headers (names lower-cased) and the body as a stream of byte chunks.

    `aclose()` releases the connection; the caller calls it once, whether or not it read the
    whole body.
    """

    status: int
    headers: Mapping[str, str]
    stream: AsyncIterator[bytes]
    aclose: Callable[[], Awaitable[None]]


class HttpTransport(Protocol):
    """Carries one HTTP request. Raises `TimeoutError` or `ConnectionError` when no response comes."""

    async def handle_async_request(self, request: HttpRequest) -> HttpResponse: ...


def lower_headers(pairs: Iterable[tuple[str, str]]) -> dict[str, str]:
    """Header pairs as a dict with lower-case names; repeated names are joined with ", "."""
    out: dict[str, str] = {}
    for name, value in pairs:
        key = str(name).lower()
        out[key] = f"{out[key]}, {value}" if key in out else str(value)
    return out
