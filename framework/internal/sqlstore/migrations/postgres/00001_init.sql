-- The framework's tables on PostgreSQL. {{.P}} is the configured table
-- prefix (a validated identifier, possibly empty). Times are timestamptz,
-- written in UTC.

-- +goose Up
CREATE TABLE IF NOT EXISTS {{.P}}processed_events (
    consumer     text        NOT NULL,
    source       text        NOT NULL,
    event_id     text        NOT NULL,
    processed_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
);
-- Purging marks older than the retention reads this index.
CREATE INDEX IF NOT EXISTS {{.P}}processed_events_processed_at_idx ON {{.P}}processed_events (processed_at);

CREATE TABLE IF NOT EXISTS {{.P}}dead_letters (
    id              bigserial   PRIMARY KEY,
    consumer        text        NOT NULL,
    topic           text        NOT NULL DEFAULT '',
    source          text        NOT NULL DEFAULT '',
    event_id        text        NOT NULL,
    type            text        NOT NULL DEFAULT '',
    version         integer     NOT NULL DEFAULT 0,
    subject         text        NOT NULL DEFAULT '',
    correlation_id  text        NOT NULL DEFAULT '',
    code            text        NOT NULL,
    attempts        integer     NOT NULL DEFAULT 0,
    repeats         integer     NOT NULL DEFAULT 0,
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    body            bytea       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}',
    status          text        NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'replayed', 'discarded')),
    resolved_by     text,
    resolved_at     timestamptz,
    resolve_reason  text,
    UNIQUE (consumer, source, event_id)
);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_status_idx ON {{.P}}dead_letters (status, id);
CREATE INDEX IF NOT EXISTS {{.P}}dead_letters_code_idx ON {{.P}}dead_letters (code, id);

CREATE TABLE IF NOT EXISTS {{.P}}outbox (
    id          bigserial   PRIMARY KEY,
    event_id    text        NOT NULL,
    source      text        NOT NULL,
    type        text        NOT NULL,
    subject     text        NOT NULL DEFAULT '',
    subject_seq bigint      NOT NULL DEFAULT 0,
    body        bytea       NOT NULL,
    created_at  timestamptz NOT NULL,
    sent_at     timestamptz,
    -- claimed_until: a relay's lease on an unsent row, used on SQLite;
    -- here relays lock rows (FOR UPDATE SKIP LOCKED) instead.
    claimed_until timestamptz,
    UNIQUE (source, event_id)
);
CREATE INDEX IF NOT EXISTS {{.P}}outbox_unsent_idx ON {{.P}}outbox (id) WHERE sent_at IS NULL;

CREATE TABLE IF NOT EXISTS {{.P}}subject_checkpoints (
    consumer text   NOT NULL,
    subject  text   NOT NULL,
    seq      bigint NOT NULL,
    PRIMARY KEY (consumer, subject)
);

CREATE TABLE IF NOT EXISTS {{.P}}parked_events (
    consumer  text        NOT NULL,
    subject   text        NOT NULL,
    seq       bigint      NOT NULL,
    source    text        NOT NULL,
    event_id  text        NOT NULL,
    topic     text        NOT NULL DEFAULT '',
    body      bytea       NOT NULL,
    metadata  jsonb       NOT NULL DEFAULT '{}',
    parked_at timestamptz NOT NULL,
    reason    text        NOT NULL,
    PRIMARY KEY (consumer, subject, seq)
);

CREATE TABLE IF NOT EXISTS {{.P}}deliveries (
    consumer text        NOT NULL,
    source   text        NOT NULL,
    event_id text        NOT NULL,
    count    integer     NOT NULL,
    first_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, source, event_id)
);

-- +goose Down
DROP TABLE IF EXISTS {{.P}}deliveries;
DROP TABLE IF EXISTS {{.P}}parked_events;
DROP TABLE IF EXISTS {{.P}}subject_checkpoints;
DROP TABLE IF EXISTS {{.P}}outbox;
DROP TABLE IF EXISTS {{.P}}dead_letters;
DROP TABLE IF EXISTS {{.P}}processed_events;
