package soak

import (
	"context"
	"fmt"
	"sort"
	"strings"
)

// diagnose logs the state of up to five subjects that the projection did
// not complete: what it holds, the checkpoint, the parked events, the
// dead letters and the replays of their events.
func (r *run) diagnose(ctx context.Context) {
	want := r.plan.Expected()
	var rows []struct {
		Subject string
		LastSeq int64 `db:"last_seq"`
		Applied int64
	}
	if err := r.db.SelectContext(ctx, &rows, `SELECT subject, last_seq, applied FROM soak_projection`); err != nil {
		r.logf("diagnose: %v", err)
		return
	}
	have := map[string][2]int64{}
	for _, row := range rows {
		have[row.Subject] = [2]int64{row.LastSeq, row.Applied}
	}
	var bad []string
	for s, w := range want {
		if have[s] != w {
			bad = append(bad, s)
		}
	}
	sort.Strings(bad)
	r.logf("diagnose: %d subjects incomplete", len(bad))
	for _, s := range bad[:min(len(bad), 5)] {
		var b strings.Builder
		fmt.Fprintf(&b, "subject %s: want (last, applied) %v, have %v", s, want[s], have[s])
		var cp []int64
		_ = r.db.SelectContext(ctx, &cp, `SELECT seq FROM subject_checkpoints WHERE consumer = $1 AND subject = $2`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; checkpoint %v", cp)
		var parked []string
		_ = r.db.SelectContext(ctx, &parked, `SELECT seq || ' ' || event_id || ' ' || reason FROM parked_events WHERE consumer = $1 AND subject = $2 ORDER BY seq`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; parked %v", parked)
		var dls []string
		_ = r.db.SelectContext(ctx, &dls, `SELECT id || ' ' || event_id || ' ' || code || ' ' || status FROM dead_letters WHERE consumer = $1 AND subject = $2 ORDER BY id`, ProjectionConsumer, s)
		fmt.Fprintf(&b, "; dead letters %v", dls)
		var applied []string
		_ = r.db.SelectContext(ctx, &applied, `SELECT e.event_id FROM soak_effects e WHERE e.consumer = $1 AND e.event_id LIKE $2 ORDER BY 1`, ProjectionConsumer, "e"+s[1:]+"%")
		fmt.Fprintf(&b, "; applied %v", applied)
		var replays []string
		_ = r.db.SelectContext(ctx, &replays, `SELECT id || ' dl ' || dead_letter_id || ' ' || (metadata->>'subjectseq') || ' sent ' || coalesce(sent_at::text, 'no') FROM replays WHERE consumer = $1 AND convert_from(body, 'UTF8') LIKE $2 ORDER BY id`, ProjectionConsumer, `%"subject":"`+s+`"%`)
		fmt.Fprintf(&b, "; replays %v", replays)
		r.logf("%s", b.String())
	}
}
