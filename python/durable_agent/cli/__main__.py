"""``python -m durable_agent.cli``: the ``durable-agent`` console script."""

from __future__ import annotations

from . import main

if __name__ == "__main__":
    raise SystemExit(main())
