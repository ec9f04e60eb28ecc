-- Safe replay, the history of every dead letter and the event view.
-- {{.P}} is the configured table prefix.

-- +goose Up
-- subject_seq orders a bulk replay per subject (numerically); deliveries
-- is the message's delivery count when it was dead-lettered last.
ALTER TABLE {{.P}}dead_letters ADD COLUMN IF NOT EXISTS subject_seq bigint NOT NULL DEFAULT 0;
ALTER TABLE {{.P}}dead_letters ADD COLUMN IF NOT EXISTS deliveries integer NOT NULL DEFAULT 0;
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_event_idx ON {{.P}}dead_letters (source, event_id);

-- Append-only: every failure of a dead letter and every resolution.
CREATE TABLE IF NOT EXISTS {{.P}}dead_letter_history (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL,
    at             timestamptz NOT NULL,
    kind           text        NOT NULL CHECK (kind IN ('failed', 'replayed', 'discarded', 'adopted')),
    code           text        NOT NULL DEFAULT '',
    attempts       integer     NOT NULL DEFAULT 0,
    deliveries     integer     NOT NULL DEFAULT 0,
    actor          text        NOT NULL DEFAULT '',
    reason         text        NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letter_history_dl_idx ON {{.P}}dead_letter_history (dead_letter_id, id);
INSERT INTO {{.P}}dead_letter_history (dead_letter_id, at, kind, code, attempts)
SELECT id, last_failed_at, 'failed', code, attempts FROM {{.P}}dead_letters
WHERE NOT EXISTS (SELECT 1 FROM {{.P}}dead_letter_history h WHERE h.dead_letter_id = {{.P}}dead_letters.id);
INSERT INTO {{.P}}dead_letter_history (dead_letter_id, at, kind, actor, reason)
SELECT id, resolved_at, status, COALESCE(resolved_by, ''), COALESCE(resolve_reason, '') FROM {{.P}}dead_letters
WHERE status <> 'pending' AND resolved_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM {{.P}}dead_letter_history h WHERE h.dead_letter_id = {{.P}}dead_letters.id AND h.kind <> 'failed');

-- A message to hand to one consumer alone: a replayed dead letter (its
-- dead_letter_id) or an event released from parking (dead_letter_id 0).
-- Written in the transaction that resolves the dead letter; the service's
-- replay relay publishes it through the transport's replay path and then
-- sets sent_at.
CREATE TABLE IF NOT EXISTS {{.P}}replays (
    id             bigserial   PRIMARY KEY,
    dead_letter_id bigint      NOT NULL DEFAULT 0,
    consumer       text        NOT NULL,
    topic          text        NOT NULL DEFAULT '',
    body           bytea       NOT NULL,
    metadata       jsonb       NOT NULL DEFAULT '{}',
    created_at     timestamptz NOT NULL,
    sent_at        timestamptz,
    claimed_until  timestamptz
);
CREATE INDEX IF NOT EXISTS {{.P}}replays_unsent_idx ON {{.P}}replays (id) WHERE sent_at IS NULL;

-- How far each purge has removed evidence: rows of kind ('processed',
-- 'outbox', 'dead_letters') older than purged_before may be gone.
CREATE TABLE IF NOT EXISTS {{.P}}purge_horizons (
    kind          text        PRIMARY KEY,
    purged_before timestamptz NOT NULL
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}purge_horizons;
DROP TABLE IF EXISTS {{.P}}replays;
DROP TABLE IF EXISTS {{.P}}dead_letter_history;
DROP INDEX IF EXISTS {{.P}}dead_letters_event_idx;
ALTER TABLE {{.P}}dead_letters DROP COLUMN IF EXISTS deliveries;
ALTER TABLE {{.P}}dead_letters DROP COLUMN IF EXISTS subject_seq;
