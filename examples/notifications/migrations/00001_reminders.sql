-- +goose Up
CREATE TABLE reminders (
    appointment_id TEXT NOT NULL,
    starts_at      TEXT NOT NULL,
    event_id       TEXT NOT NULL
);

-- +goose Down
DROP TABLE reminders;
