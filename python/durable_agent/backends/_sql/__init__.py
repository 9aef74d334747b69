"""Everything durable-agent says to a SQL database, written once for SQLite and Postgres, without I/O.

* `plan`: `Query`, the typed `Plan`, the one `Dialect` (`SQLITE`, `POSTGRES`), migrations,
  the executors `run_sync` / `run_async`, and `Mergeable` (writes a batching executor runs together);
* `checkpoints`: the checkpoint stores' tables and plans (also written by the SQL runtimes);
* `journal_schema` and `journal`: the step journal's tables and plans (SQLite and Postgres runtimes).

The connections, transactions and threads are the callers': `durable_agent.backends.sqlite`,
`durable_agent.backends.postgres`, `durable_agent.backends.sqlite`, `durable_agent.backends.postgres`
and `durable_agent.http._sql_logs`.
"""
