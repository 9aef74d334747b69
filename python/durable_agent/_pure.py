"""The pure-Python kernels: the reference implementation the native extension mirrors name for name."""

from __future__ import annotations

from ._codec_pure import decode, encode

__all__ = ["decode", "encode"]
