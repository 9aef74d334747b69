"""The storage core: what every backend shares, with no I/O and no backend of its own.

Records (`records`), step keys (`keys`), the lease rules (`leases`), the run scope that journals a
run's steps (`scope`), the runtime adapters written once over a backend's rows (`stored`), the
stored form of a run's history (`history`, `step_log`) and the seam that seals its rows under a
keyring or not (`sealing`), the checks every store applies
(`validate`), the store rules for the stores that read their run index in Python (`indexed`:
memory, JSONL, Durable Object), the sync and async faces of a store (`faces`) and the seams as
Protocols (`protocols`).

The layering rule (docs/layers.md, checked by tests/test_layers.py): this package imports only
the foundation modules (`errors`, `checkpoint`, `messages`, `_util`, `_kernels`, `encryption`); every backend
(`durable_agent.backends`) imports it; nothing here imports a backend or the agent loop. The
public names live in `durable_agent` and `durable_agent.backends`; these modules are private.
"""
