"""The step journal's tables (the SQLite and Postgres runtimes'), and the plan creating or migrating them.

Tables: ``durable_agent_steps`` (one row per (session, key), ``id`` keeps insertion order),
``durable_agent_partials``, ``durable_agent_awakeables``, ``durable_agent_leases`` (epoch,
owner, renewal, the run marked in progress), ``durable_agent_queues``,
``durable_agent_submissions``, ``durable_agent_tool_state``, ``durable_agent_last_runs``;
``durable_agent_journal_schema_version`` records the schema version. The runtimes write
checkpoints too, in the checkpoint stores' tables (`durable_agent.backends._sql.checkpoints`).
"""

from __future__ import annotations

from . import checkpoints
from .plan import Dialect, Plan, migrate_plan

STEPS = "durable_agent_steps"
PARTIALS = "durable_agent_partials"
AWAKEABLES = "durable_agent_awakeables"
LEASES = "durable_agent_leases"
QUEUES = "durable_agent_queues"
SUBMISSIONS = "durable_agent_submissions"
TOOL_STATE = "durable_agent_tool_state"
LAST_RUNS = "durable_agent_last_runs"
VERSIONS = "durable_agent_journal_schema_version"
SCHEMA_VERSION = 1
SCHEMA_LOCK = 20261  # the migration lock's key (Postgres advisory lock)


def _schema_v1(d: Dialect) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {STEPS} (id {d.serial}, session_id TEXT NOT NULL, key TEXT NOT NULL,"
        " run_id TEXT NOT NULL, kind TEXT NOT NULL, replay TEXT NOT NULL, status TEXT NOT NULL,"
        " fingerprint TEXT, result TEXT NOT NULL, error TEXT, tool_state TEXT, UNIQUE (session_id, key))",
        f"CREATE INDEX IF NOT EXISTS {STEPS}_run ON {STEPS} (session_id, run_id)",
        f"CREATE TABLE IF NOT EXISTS {PARTIALS} (id {d.serial}, session_id TEXT NOT NULL, run_id TEXT NOT NULL,"
        " step_key TEXT NOT NULL, seq INTEGER NOT NULL, text TEXT NOT NULL, thinking TEXT)",
        f"CREATE INDEX IF NOT EXISTS {PARTIALS}_step ON {PARTIALS} (session_id, step_key)",
        f"CREATE INDEX IF NOT EXISTS {PARTIALS}_run ON {PARTIALS} (session_id, run_id)",
        f"CREATE TABLE IF NOT EXISTS {AWAKEABLES} (id TEXT PRIMARY KEY, session_id TEXT NOT NULL,"
        " key TEXT NOT NULL, resolved INTEGER NOT NULL, value TEXT NOT NULL, deadline BIGINT,"
        " UNIQUE (session_id, key))",
        f"CREATE TABLE IF NOT EXISTS {LEASES} (session_id TEXT PRIMARY KEY, epoch BIGINT NOT NULL,"
        " owner_host TEXT, owner_pid BIGINT, owner_token TEXT, renewed_at BIGINT NOT NULL,"
        " released INTEGER NOT NULL, resumable_run TEXT)",
        f"CREATE TABLE IF NOT EXISTS {QUEUES} (session_id TEXT PRIMARY KEY, entries TEXT NOT NULL)",
        f"CREATE TABLE IF NOT EXISTS {SUBMISSIONS} (session_id TEXT NOT NULL, request_id TEXT NOT NULL,"
        " fingerprint TEXT NOT NULL, result TEXT NOT NULL, settled INTEGER NOT NULL,"
        " PRIMARY KEY (session_id, request_id))",
        f"CREATE TABLE IF NOT EXISTS {TOOL_STATE} (session_id TEXT NOT NULL, key TEXT NOT NULL,"
        " value TEXT NOT NULL, PRIMARY KEY (session_id, key))",
        f"CREATE TABLE IF NOT EXISTS {LAST_RUNS} (session_id TEXT PRIMARY KEY, run_id TEXT NOT NULL)",
    ]


MIGRATIONS = {1: _schema_v1}


def schema_plan(d: Dialect) -> Plan[None]:
    """Create or migrate the journal tables to `SCHEMA_VERSION`, and the checkpoint tables the journal writes."""
    yield from checkpoints.schema_plan(d)
    migrations = {version: make(d) for version, make in MIGRATIONS.items()}
    yield from migrate_plan(d, SCHEMA_LOCK, VERSIONS, SCHEMA_VERSION, migrations, "the journal schema")
