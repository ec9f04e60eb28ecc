-- The operator console's bulk jobs: a replay or discard of the pending
-- dead letters a filter selects, run by the process that took the
-- request. Times are the database's own (statement_timestamp()), so
-- that processes need not agree on their clocks.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- kind is replay or discard; filter the JSON of the consumer, code and
-- time range; rate the most dead letters a second (0: no limit).
-- status is running, done, cancelled or interrupted; a running job whose
-- heartbeat is stale reads as interrupted (its process is gone). last_id
-- is the last dead letter handled: a resumed job goes on after it.
CREATE TABLE IF NOT EXISTS {{.P}}bulk_jobs (
    id           bigserial        PRIMARY KEY,
    kind         text             NOT NULL,
    filter       text             NOT NULL,
    rate         double precision NOT NULL DEFAULT 0,
    reason       text             NOT NULL,
    by_name      text             NOT NULL,
    status       text             NOT NULL,
    done         bigint           NOT NULL DEFAULT 0,
    refused      bigint           NOT NULL DEFAULT 0,
    total        bigint           NOT NULL DEFAULT 0,
    last_id      bigint           NOT NULL DEFAULT 0,
    owner        text             NOT NULL,
    heartbeat_at timestamptz      NOT NULL,
    created_at   timestamptz      NOT NULL,
    updated_at   timestamptz      NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}bulk_jobs;
