-- Partitioned consumer groups: the live processes of each consumer and
-- the owner of each of its partitions. Times are INTEGER nanoseconds
-- since the Unix epoch (UTC), read from SQLite's own clock.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- A process of a consumer's group, alive until expires_at unless its
-- heartbeat renews it.
CREATE TABLE IF NOT EXISTS {{.P}}consumer_members (
    consumer   TEXT    NOT NULL,
    member     TEXT    NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, member)
) WITHOUT ROWID;

-- The lease of one partition of a consumer: owner ('' when released)
-- holds it until expires_at unless it renews it; token, the fencing
-- token, grows each time the partition changes owner. A row is never
-- deleted, so that a token is never given twice.
CREATE TABLE IF NOT EXISTS {{.P}}partition_leases (
    consumer   TEXT    NOT NULL,
    partition  INTEGER NOT NULL,
    owner      TEXT    NOT NULL DEFAULT '',
    token      INTEGER NOT NULL,
    expires_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, partition)
) WITHOUT ROWID;

-- The number of partitions of a consumer, recorded when it first runs
-- partitioned: a start with another number is refused, since the
-- subjects would map to other partitions while events are in flight.
CREATE TABLE IF NOT EXISTS {{.P}}consumer_partitions (
    consumer   TEXT    NOT NULL PRIMARY KEY,
    partitions INTEGER NOT NULL
) WITHOUT ROWID;

-- +goose Down
DROP TABLE IF EXISTS {{.P}}consumer_partitions;
DROP TABLE IF EXISTS {{.P}}partition_leases;
DROP TABLE IF EXISTS {{.P}}consumer_members;
