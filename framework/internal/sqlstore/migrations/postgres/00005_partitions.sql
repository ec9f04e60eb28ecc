-- Partitioned consumer groups: the live processes of each consumer and
-- the owner of each of its partitions. Times are the database's own
-- (now()), so that processes need not agree on their clocks.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- A process of a consumer's group, alive until expires_at unless its
-- heartbeat renews it.
CREATE TABLE IF NOT EXISTS {{.P}}consumer_members (
    consumer   text        NOT NULL,
    member     text        NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, member)
);

-- The lease of one partition of a consumer: owner ('' when released)
-- holds it until expires_at unless it renews it; token, the fencing
-- token, grows each time the partition changes owner. A row is never
-- deleted, so that a token is never given twice.
--
-- The unique key with token makes token a key column: an update that
-- changes it (a change of owner) locks the row FOR UPDATE, which waits
-- for the attempts that fenced the lease (FOR KEY SHARE), while one
-- that only moves expires_at or owner (a renewal, a release) locks it
-- FOR NO KEY UPDATE, which does not.
CREATE TABLE IF NOT EXISTS {{.P}}partition_leases (
    consumer   text        NOT NULL,
    partition  integer     NOT NULL,
    owner      text        NOT NULL DEFAULT '',
    token      bigint      NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, partition),
    UNIQUE (consumer, partition, token)
);

-- The number of partitions of a consumer, recorded when it first runs
-- partitioned: a start with another number is refused, since the
-- subjects would map to other partitions while events are in flight.
CREATE TABLE IF NOT EXISTS {{.P}}consumer_partitions (
    consumer   text    NOT NULL PRIMARY KEY,
    partitions integer NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}consumer_partitions;
DROP TABLE IF EXISTS {{.P}}partition_leases;
DROP TABLE IF EXISTS {{.P}}consumer_members;
