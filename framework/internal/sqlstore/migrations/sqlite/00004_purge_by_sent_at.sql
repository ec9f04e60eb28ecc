-- The outbox's cleanup and the purge of sent replays find the rows sent
-- before a time through an index on when they were sent, so that a purge
-- reads what it deletes and no more: walking the ids instead looked at
-- every sent row kept (a day's, by default) at each purge that found
-- little or nothing to delete.
-- {{.P}} is the configured table prefix; times are INTEGER nanoseconds
-- since the Unix epoch (UTC).

-- +goose Up
CREATE INDEX IF NOT EXISTS {{.P}}outbox_sent_idx ON {{.P}}outbox (sent_at) WHERE sent_at IS NOT NULL;
CREATE INDEX IF NOT EXISTS {{.P}}replays_sent_at_idx ON {{.P}}replays (sent_at) WHERE sent_at IS NOT NULL;
DROP INDEX IF EXISTS {{.P}}replays_sent_idx;

-- +goose Down
CREATE INDEX IF NOT EXISTS {{.P}}replays_sent_idx ON {{.P}}replays (id) WHERE sent_at IS NOT NULL;
DROP INDEX IF EXISTS {{.P}}replays_sent_at_idx;
DROP INDEX IF EXISTS {{.P}}outbox_sent_idx;
