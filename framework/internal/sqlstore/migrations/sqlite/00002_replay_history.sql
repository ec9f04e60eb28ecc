-- Safe replay, the history of every dead letter and the event view.
-- {{.P}} is the configured table prefix; times are INTEGER nanoseconds
-- since the Unix epoch (UTC).

-- +goose Up
-- subject_seq orders a bulk replay per subject (numerically); deliveries
-- is the message's delivery count when it was dead-lettered last.
ALTER TABLE {{.P}}dead_letters ADD COLUMN subject_seq INTEGER NOT NULL DEFAULT 0;
ALTER TABLE {{.P}}dead_letters ADD COLUMN deliveries INTEGER NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_event_idx ON {{.P}}dead_letters (source, event_id);

-- Append-only: every failure of a dead letter and every resolution.
CREATE TABLE IF NOT EXISTS {{.P}}dead_letter_history (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    dead_letter_id INTEGER NOT NULL,
    at             INTEGER NOT NULL,
    kind           TEXT    NOT NULL CHECK (kind IN ('failed', 'replayed', 'discarded', 'adopted')),
    code           TEXT    NOT NULL DEFAULT '',
    attempts       INTEGER NOT NULL DEFAULT 0,
    deliveries     INTEGER NOT NULL DEFAULT 0,
    actor          TEXT    NOT NULL DEFAULT '',
    reason         TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letter_history_dl_idx ON {{.P}}dead_letter_history (dead_letter_id, id);
INSERT INTO {{.P}}dead_letter_history (dead_letter_id, at, kind, code, attempts)
SELECT id, last_failed_at, 'failed', code, attempts FROM {{.P}}dead_letters;
INSERT INTO {{.P}}dead_letter_history (dead_letter_id, at, kind, actor, reason)
SELECT id, resolved_at, status, COALESCE(resolved_by, ''), COALESCE(resolve_reason, '') FROM {{.P}}dead_letters
WHERE status <> 'pending' AND resolved_at IS NOT NULL;

-- A message to hand to one consumer alone: a replayed dead letter (its
-- dead_letter_id) or an event released from parking (dead_letter_id 0).
-- Written in the transaction that resolves the dead letter; the service's
-- replay relay publishes it through the transport's replay path and then
-- sets sent_at.
CREATE TABLE IF NOT EXISTS {{.P}}replays (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    dead_letter_id INTEGER NOT NULL DEFAULT 0,
    consumer       TEXT    NOT NULL,
    topic          TEXT    NOT NULL DEFAULT '',
    body           BLOB    NOT NULL,
    metadata       TEXT    NOT NULL DEFAULT '{}',
    created_at     INTEGER NOT NULL,
    sent_at        INTEGER,
    claimed_until  INTEGER
);
CREATE INDEX IF NOT EXISTS {{.P}}replays_unsent_idx ON {{.P}}replays (id) WHERE sent_at IS NULL;

-- How far each purge has removed evidence: rows of kind ('processed',
-- 'outbox', 'dead_letters') older than purged_before may be gone.
CREATE TABLE IF NOT EXISTS {{.P}}purge_horizons (
    kind          TEXT    PRIMARY KEY,
    purged_before INTEGER NOT NULL
) WITHOUT ROWID;

-- +goose Down
DROP TABLE IF EXISTS {{.P}}purge_horizons;
DROP TABLE IF EXISTS {{.P}}replays;
DROP TABLE IF EXISTS {{.P}}dead_letter_history;
DROP INDEX IF EXISTS {{.P}}dead_letters_event_idx;
ALTER TABLE {{.P}}dead_letters DROP COLUMN deliveries;
ALTER TABLE {{.P}}dead_letters DROP COLUMN subject_seq;
