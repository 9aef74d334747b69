"""Test helpers for users of durable-agent: the `CheckpointStore` conformance suite (needs pytest)."""

from __future__ import annotations

from .conformance import (
    CheckpointStoreConformance,
    StoreCalls,
    conversation,
    hammer_one_run,
    make_checkpoint,
    message,
)

__all__ = [
    "CheckpointStoreConformance",
    "StoreCalls",
    "conversation",
    "hammer_one_run",
    "make_checkpoint",
    "message",
]
