-- +goose Up
CREATE TABLE notes (
    tenant  TEXT NOT NULL,
    note_id TEXT NOT NULL,
    text    TEXT NOT NULL,
    PRIMARY KEY (tenant, note_id)
);
CREATE TABLE audit_log (
    tenant   TEXT NOT NULL,
    source   TEXT NOT NULL,
    event_id TEXT NOT NULL,
    type     TEXT NOT NULL
);

-- +goose Down
DROP TABLE audit_log;
DROP TABLE notes;
