-- The framework's tables on SQLite. {{.P}} is the configured table prefix
-- (a validated identifier, possibly empty). Times are INTEGER nanoseconds
-- since the Unix epoch (UTC); metadata is JSON text.

-- +goose Up
CREATE TABLE IF NOT EXISTS {{.P}}processed_events (
    consumer     TEXT    NOT NULL,
    source       TEXT    NOT NULL,
    event_id     TEXT    NOT NULL,
    processed_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
) WITHOUT ROWID;
-- Purging marks older than the retention reads this index.
CREATE INDEX IF NOT EXISTS {{.P}}processed_events_processed_at_idx ON {{.P}}processed_events (processed_at);

CREATE TABLE IF NOT EXISTS {{.P}}dead_letters (
    id              INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer        TEXT    NOT NULL,
    topic           TEXT    NOT NULL DEFAULT '',
    source          TEXT    NOT NULL DEFAULT '',
    event_id        TEXT    NOT NULL,
    type            TEXT    NOT NULL DEFAULT '',
    version         INTEGER NOT NULL DEFAULT 0,
    subject         TEXT    NOT NULL DEFAULT '',
    correlation_id  TEXT    NOT NULL DEFAULT '',
    code            TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    repeats         INTEGER NOT NULL DEFAULT 0,
    first_failed_at INTEGER NOT NULL,
    last_failed_at  INTEGER NOT NULL,
    body            BLOB    NOT NULL,
    metadata        TEXT    NOT NULL DEFAULT '{}',
    status          TEXT    NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'replayed', 'discarded')),
    resolved_by     TEXT,
    resolved_at     INTEGER,
    resolve_reason  TEXT,
    UNIQUE (consumer, source, event_id)
);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_status_idx ON {{.P}}dead_letters (status, id);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_code_idx ON {{.P}}dead_letters (code, id);

CREATE TABLE IF NOT EXISTS {{.P}}outbox (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    type        TEXT    NOT NULL,
    subject     TEXT    NOT NULL DEFAULT '',
    subject_seq INTEGER NOT NULL DEFAULT 0,
    body        BLOB    NOT NULL,
    created_at  INTEGER NOT NULL,
    sent_at     INTEGER,
    -- claimed_until: a relay's lease on an unsent row (SQLite only; on
    -- PostgreSQL relays lock rows instead).
    claimed_until INTEGER,
    UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS {{.P}}outbox_unsent_idx ON {{.P}}outbox (id) WHERE sent_at IS NULL;

CREATE TABLE IF NOT EXISTS {{.P}}subject_checkpoints (
    consumer TEXT    NOT NULL,
    subject  TEXT    NOT NULL,
    seq      INTEGER NOT NULL,
    PRIMARY KEY (consumer, subject)
) WITHOUT ROWID;

CREATE TABLE IF NOT EXISTS {{.P}}parked_events (
    consumer  TEXT    NOT NULL,
    subject   TEXT    NOT NULL,
    seq       INTEGER NOT NULL,
    source    TEXT    NOT NULL,
    event_id  TEXT    NOT NULL,
    topic     TEXT    NOT NULL DEFAULT '',
    body      BLOB    NOT NULL,
    metadata  TEXT    NOT NULL DEFAULT '{}',
    parked_at INTEGER NOT NULL,
    reason    TEXT    NOT NULL,
    PRIMARY KEY (consumer, subject, seq)
);

CREATE TABLE IF NOT EXISTS {{.P}}deliveries (
    consumer TEXT    NOT NULL,
    source   TEXT    NOT NULL,
    event_id TEXT    NOT NULL,
    count    INTEGER NOT NULL,
    first_at INTEGER NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
) WITHOUT ROWID;

-- +goose Down
DROP TABLE IF EXISTS {{.P}}deliveries;
DROP TABLE IF EXISTS {{.P}}parked_events;
DROP TABLE IF EXISTS {{.P}}subject_checkpoints;
DROP TABLE IF EXISTS {{.P}}outbox;
DROP TABLE IF EXISTS {{.P}}dead_letters;
DROP TABLE IF EXISTS {{.P}}processed_events;
