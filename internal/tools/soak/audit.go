package soak

import (
	"context"
	"fmt"
	"strings"
)

// qAudit records, for the projection (the strict-order consumer), every
// change of a processed mark and of a parked event, with the transaction
// and the server process that made it: what diagnose prints of a subject
// that did not finish, so that a run that fails once tells how its
// events came to be where they are. It commits with the change, or not.
const qAudit = `CREATE TABLE soak_audit (
    id       BIGSERIAL PRIMARY KEY,
    at       TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp(),
    txid     BIGINT NOT NULL DEFAULT txid_current(),
    pid      INT NOT NULL DEFAULT pg_backend_pid(),
    tbl      TEXT NOT NULL,
    op       TEXT NOT NULL,
    event_id TEXT NOT NULL,
    subject  TEXT NOT NULL DEFAULT '',
    seq      BIGINT NOT NULL DEFAULT 0,
    reason   TEXT NOT NULL DEFAULT ''
);
CREATE FUNCTION soak_audit_mark() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF r.consumer = '` + ProjectionConsumer + `' THEN
        INSERT INTO soak_audit (tbl, op, event_id) VALUES ('mark', TG_OP, r.event_id);
    END IF;
    RETURN r;
END $$;
CREATE TRIGGER soak_audit_mark AFTER INSERT OR DELETE ON processed_events
    FOR EACH ROW EXECUTE FUNCTION soak_audit_mark();
CREATE FUNCTION soak_audit_parked() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE r record;
BEGIN
    IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
    IF r.consumer = '` + ProjectionConsumer + `' THEN
        INSERT INTO soak_audit (tbl, op, event_id, subject, seq, reason)
        VALUES ('parked', TG_OP, r.event_id, r.subject, r.seq, r.reason);
    END IF;
    RETURN r;
END $$;
CREATE TRIGGER soak_audit_parked AFTER INSERT OR UPDATE OR DELETE ON parked_events
    FOR EACH ROW EXECUTE FUNCTION soak_audit_parked();
CREATE FUNCTION soak_audit_checkpoint() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.consumer = '` + ProjectionConsumer + `' AND (TG_OP = 'INSERT' OR OLD.seq <> NEW.seq) THEN
        INSERT INTO soak_audit (tbl, op, event_id, subject, seq)
        VALUES ('checkpoint', TG_OP, '', NEW.subject, NEW.seq);
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER soak_audit_checkpoint AFTER INSERT OR UPDATE ON subject_checkpoints
    FOR EACH ROW EXECUTE FUNCTION soak_audit_checkpoint();`

// migrate migrates the service's database, and installs qAudit's
// triggers on its tables.
func (r *run) migrate(ctx context.Context) error {
	if _, err := r.svc.command(ctx, "migrate"); err != nil {
		return err
	}
	if _, err := r.db.ExecContext(ctx, qAudit); err != nil {
		return fmt.Errorf("soak: audit triggers: %w", err)
	}
	return nil
}

// auditTrail returns the audit of subject (see qAudit): the changes of
// its parked events and checkpoint, and of the marks of its events (a
// mark has no subject: its events are the plan's), one change a line, in
// the order they were made.
func (r *run) auditTrail(ctx context.Context, subject string) string {
	var ids []string
	for _, it := range r.plan.Items {
		if it.Subject == subject {
			ids = append(ids, it.ID)
		}
	}
	var lines []string
	err := r.db.SelectContext(ctx, &lines, `SELECT to_char(at, 'HH24:MI:SS.US') || ' tx ' || txid || ' pid ' || pid || ' ' ||
    tbl || ' ' || op || ' ' || event_id || CASE WHEN tbl = 'mark' THEN '' ELSE ' #' || seq || ' ' || reason END
FROM soak_audit WHERE subject = $1 OR tbl = 'mark' AND event_id = ANY($2) ORDER BY id`, subject, ids)
	if err != nil {
		return fmt.Sprintf("audit: %v", err)
	}
	return strings.Join(lines, "\n")
}
