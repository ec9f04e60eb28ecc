-- +goose Up
CREATE TABLE soak_effects (
    consumer TEXT NOT NULL,
    event_id TEXT NOT NULL
);
CREATE TABLE soak_attempts (
    consumer TEXT NOT NULL,
    event_id TEXT NOT NULL,
    PRIMARY KEY (consumer, event_id)
);
CREATE TABLE soak_projection (
    subject  TEXT PRIMARY KEY,
    last_seq BIGINT NOT NULL,
    applied  BIGINT NOT NULL
);
CREATE TABLE soak_produced (
    id         INTEGER PRIMARY KEY,
    events     BIGINT NOT NULL,
    duplicates BIGINT NOT NULL
);
INSERT INTO soak_produced (id, events, duplicates) VALUES (1, 0, 0);

-- +goose Down
DROP TABLE soak_produced;
DROP TABLE soak_projection;
DROP TABLE soak_attempts;
DROP TABLE soak_effects;
