-- The operator console's bulk jobs: a replay or discard of the pending
-- dead letters a filter selects, run by the process that took the
-- request. Times are INTEGER nanoseconds since the Unix epoch (UTC),
-- read from SQLite's own clock.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- kind is replay or discard; filter the JSON of the consumer, code and
-- time range; rate the most dead letters a second (0: no limit).
-- status is running, done, cancelled or interrupted; a running job whose
-- heartbeat is stale reads as interrupted (its process is gone). last_id
-- is the last dead letter handled: a resumed job goes on after it.
CREATE TABLE IF NOT EXISTS {{.P}}bulk_jobs (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    kind         TEXT    NOT NULL,
    filter       TEXT    NOT NULL,
    rate         REAL    NOT NULL DEFAULT 0,
    reason       TEXT    NOT NULL,
    by_name      TEXT    NOT NULL,
    status       TEXT    NOT NULL,
    done         INTEGER NOT NULL DEFAULT 0,
    refused      INTEGER NOT NULL DEFAULT 0,
    total        INTEGER NOT NULL DEFAULT 0,
    last_id      INTEGER NOT NULL DEFAULT 0,
    owner        TEXT    NOT NULL,
    heartbeat_at INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}bulk_jobs;
