-- Retention that scales: the indexes of the purges, and the leases that
-- let one process of a service purge at a time.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- The purge of delivery counts finds the old ones by first_at.
CREATE INDEX IF NOT EXISTS {{.P}}deliveries_first_at_idx ON {{.P}}deliveries (first_at);
-- The purge of resolved dead letters reads them by resolution time.
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_resolved_idx ON {{.P}}dead_letters (resolved_at) WHERE status <> 'pending';
-- The purge of sent replays reads them by id.
CREATE INDEX IF NOT EXISTS {{.P}}replays_sent_idx ON {{.P}}replays (id) WHERE sent_at IS NOT NULL;

-- A lease held by one process at a time (the purge's): taken when free or
-- ended, renewed by its holder, released at the end of its work.
CREATE TABLE IF NOT EXISTS {{.P}}leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    expires_at timestamptz NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}leases;
DROP INDEX IF EXISTS {{.P}}replays_sent_idx;
DROP INDEX IF EXISTS {{.P}}dead_letters_resolved_idx;
DROP INDEX IF EXISTS {{.P}}deliveries_first_at_idx;
