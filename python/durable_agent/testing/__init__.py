"""Test helpers for users of durable-agent: the `SessionStore` conformance suite (needs pytest)."""

from __future__ import annotations

from .conformance import (
    SessionStoreConformance,
    StoreDriver,
    conversation,
    hammer_one_run,
    make_checkpoint,
    message,
)

__all__ = [
    "SessionStoreConformance",
    "StoreDriver",
    "conversation",
    "hammer_one_run",
    "make_checkpoint",
    "message",
]
