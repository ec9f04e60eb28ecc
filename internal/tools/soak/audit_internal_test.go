package soak

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// TestAuditTrail: the audit of a subject holds the changes of its parked
// events and checkpoint and the marks of its own events (the plan's),
// none of another subject's, whatever their ids share; the projection's
// only.
func TestAuditTrail(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	db := testenv.Postgres(t)
	// The columns the triggers read of the framework's tables.
	_, err := db.ExecContext(ctx, `CREATE TABLE processed_events (consumer text, source text, event_id text);
CREATE TABLE parked_events (consumer text, subject text, seq bigint, event_id text, reason text);
CREATE TABLE subject_checkpoints (consumer text, subject text, seq bigint);`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, qAudit)
	require.NoError(t, err)
	r := &run{db: db, plan: Plan{Items: []Item{
		{ID: "e000000", Subject: "s00002", Seq: 1},
		{ID: "e000020", Subject: "s00007", Seq: 1}, // its id starts as s00002's digits
		{ID: "e000031", Subject: "s00002", Seq: 2},
	}}}
	p := ProjectionConsumer
	for _, q := range []struct {
		stmt string
		args []any
	}{
		{`INSERT INTO processed_events VALUES ($1, 'src', 'e000000'), ($1, 'src', 'e000020'), ('other', 'src', 'e000031')`, []any{p}},
		{`INSERT INTO parked_events VALUES ($1, 's00002', 2, 'e000031', 'gap'), ($1, 's00007', 1, 'e000020', 'gap')`, []any{p}},
		{`DELETE FROM parked_events WHERE subject = 's00002'`, nil},
		{`INSERT INTO subject_checkpoints VALUES ($1, 's00002', 1), ($1, 's00007', 1)`, []any{p}},
		{`UPDATE subject_checkpoints SET seq = 2 WHERE subject = 's00002'`, nil},
		{`DELETE FROM processed_events WHERE event_id = 'e000000'`, nil},
	} {
		_, err := db.ExecContext(ctx, q.stmt, q.args...)
		require.NoError(t, err, q.stmt)
	}
	var changes []string
	for _, line := range strings.Split(r.auditTrail(ctx, "s00002"), "\n") {
		f := strings.Fields(line)
		require.GreaterOrEqual(t, len(f), 8, "a change: %q", line)
		changes = append(changes, strings.Join(f[5:], " ")) // after the time, tx and pid
	}
	require.Equal(t, []string{
		"mark INSERT e000000",
		"parked INSERT e000031 #2 gap",
		"parked DELETE e000031 #2 gap",
		"checkpoint INSERT #1",
		"checkpoint UPDATE #2",
		"mark DELETE e000000",
	}, changes)
}
