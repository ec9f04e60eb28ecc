package latest_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/latest"
)

// What a service's projection holds: an event contract whose every event
// carries the appointment's whole state, a table of its own, and a handler
// that keeps the newest state of each appointment.

type ChangedV1 struct {
	AppointmentID string `json:"appointmentId" validate:"required"`
	Status        string `json:"status" validate:"required"`
}

var Changed = framework.Define[ChangedV1]("appointments.appointment.changed", 1)

const projectionName = "views.appointments"

// poison is a status whose handler fails permanently after its upsert:
// the attempt rolls back, and the upsert with it.
const poison = "poison"

var viewMigrations = fstest.MapFS{"00001_appointment_view.sql": {Data: []byte(`-- +goose Up
` + viewDDL + `;
CREATE TABLE runs (event_id TEXT PRIMARY KEY, txid TEXT NOT NULL);
-- +goose Down
DROP TABLE runs;
DROP TABLE appointment_view;
`)}}

// projection keeps appointment_view; on PostgreSQL it also records the
// transaction each event committed in.
type projection struct {
	db      *sqlx.DB
	view    *latest.Table
	mu      sync.Mutex
	applied map[string]bool // by event id, as the last run reported it
}

func (p *projection) Handle(ctx context.Context, ev framework.Event[ChangedV1]) error {
	stamp, ok := latest.FromContext(ctx)
	if !ok {
		return errors.New("no stamp in the context")
	}
	if stamp != latest.StampOf(ev.Attributes) {
		return fmt.Errorf("stamp %+v from the context, %+v from the event", stamp, latest.StampOf(ev.Attributes))
	}
	conn := framework.Conn(ctx, p.db)
	applied, err := p.view.Upsert(ctx, conn, latest.Row{
		Key:    []any{ev.Data.AppointmentID},
		Stamp:  stamp,
		Values: []any{ev.Data.Status, ev.ID},
	})
	if err != nil {
		return err
	}
	if p.db.DriverName() == "pgx" {
		if _, err := conn.ExecContext(ctx, `INSERT INTO runs (event_id, txid) VALUES ($1, txid_current()::text)`, ev.ID); err != nil {
			return fmt.Errorf("record run: %w", err)
		}
	}
	if ev.Data.Status == poison {
		return framework.Permanent("poisoned", errors.New("poisoned on purpose"))
	}
	p.mu.Lock()
	p.applied[ev.ID] = applied
	p.mu.Unlock()
	return nil
}

func (p *projection) wasApplied(t *testing.T, id string) bool {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	applied, ok := p.applied[id]
	require.True(t, ok, "event %s was not handled", id)
	return applied
}

// chainSetup is one test's kit (group commit on: the kit's unit of work
// batches concurrent attempts), projection and consumer chain.
type chainSetup struct {
	kit   *testkit.Kit
	proj  *projection
	chain *testkit.Chain
}

// kits runs test on SQLite and on PostgreSQL.
func kits(t *testing.T, test func(t *testing.T, s *chainSetup)) {
	t.Helper()
	for name, url := range map[string]func(t *testing.T) string{
		"SQLite":     func(*testing.T) string { return "" },
		"PostgreSQL": func(t *testing.T) string { return testenv.Require(t, testenv.PostgresURLVar) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			kit := testkit.New(t, testkit.Config{PostgresURL: url(t), Migrations: viewMigrations})
			p := &projection{db: kit.DB(), view: newView(t), applied: make(map[string]bool)}
			test(t, &chainSetup{kit: kit, proj: p, chain: kit.Chain(t, projectionName, framework.Handle(Changed, p.Handle))})
		})
	}
}

// changed is the event id of appointment id's state status at seq.
func changed(t *testing.T, eventID, id string, seq int64, status string) framework.Envelope {
	t.Helper()
	return testkit.Envelope(t, Changed, ChangedV1{AppointmentID: id, Status: status},
		framework.Attributes{ID: eventID, Source: "appointments", Subject: id, SubjectSeq: seq})
}

// TestOutOfOrderEvents delivers distinct events of one appointment out of
// order through the consumer chain: each is processed (none is a
// duplicate, so the processed mark absorbs none), and the row ends with
// the newest state.
func TestOutOfOrderEvents(t *testing.T) {
	t.Parallel()
	kits(t, func(t *testing.T, s *chainSetup) {
		ctx := t.Context()
		seven := changed(t, "e-7", "a-1", 7, "booked")
		for _, env := range []framework.Envelope{
			seven,
			changed(t, "e-9", "a-1", 9, "cancelled"),
			changed(t, "e-8", "a-1", 8, "rescheduled"),
			changed(t, "e-9-again", "a-1", 9, "cancelled, sent again"),
		} {
			testkit.RequireProcessed(t, s.chain.Deliver(ctx, t, env))
		}
		testkit.RequireDuplicate(t, s.chain.Deliver(ctx, t, seven))

		require.True(t, s.proj.wasApplied(t, "e-7"))
		require.True(t, s.proj.wasApplied(t, "e-9"))
		require.False(t, s.proj.wasApplied(t, "e-8"), "older than the stored state")
		require.False(t, s.proj.wasApplied(t, "e-9-again"), "an equal sequence is not newer")
		require.Equal(t, viewRow{Seq: 9, Status: "cancelled", EventID: "e-9"}, readView(t, s.kit.DB(), "a-1"))
	})
}

// TestUnsequencedEvent dead-letters an event without a subject sequence
// with code unsequenced, at once, without writing the row.
func TestUnsequencedEvent(t *testing.T) {
	t.Parallel()
	kits(t, func(t *testing.T, s *chainSetup) {
		ctx := t.Context()
		res := s.chain.Deliver(ctx, t, changed(t, "e-0", "a-1", 0, "booked"))
		testkit.RequireDeadLettered(t, res, latest.CodeUnsequenced)
		require.Equal(t, 1, res.Attempts)
		var n int
		require.NoError(t, s.kit.DB().Get(&n, `SELECT count(*) FROM appointment_view`))
		require.Zero(t, n)
	})
}

// TestConcurrentOutOfOrderEvents delivers the events of several
// appointments all at once, in a shuffled order, so that the unit of work
// gathers them into batches that share a transaction: every row ends with
// its newest state, and a poisoned newer event, dead-lettered, leaves no
// trace, though its batch-mates committed. On PostgreSQL, the transaction
// ids the handler recorded show that events did share transactions; the
// round is repeated with new appointments until some did (a shared batch
// is all but certain with every delivery started at once, but no timing
// is promised).
func TestConcurrentOutOfOrderEvents(t *testing.T) {
	t.Parallel()
	const (
		subjects = 8
		seqs     = 4 // then seqs+1 is the poisoned one
		rounds   = 5
	)
	kits(t, func(t *testing.T, s *chainSetup) {
		ctx := t.Context()
		postgres := s.kit.DB().DriverName() == "pgx"
		for round := range rounds {
			var envs []framework.Envelope
			for subject := range subjects {
				id := fmt.Sprintf("a-%d-%d", round, subject)
				for seq := int64(1); seq <= seqs+1; seq++ {
					status := fmt.Sprintf("state %d", seq)
					if seq == seqs+1 {
						status = poison
					}
					envs = append(envs, changed(t, fmt.Sprintf("%s-e%d", id, seq), id, seq, status))
				}
			}
			rand.Shuffle(len(envs), func(i, j int) { envs[i], envs[j] = envs[j], envs[i] })

			results := s.chain.DeliverTogether(ctx, t, envs...)
			require.Equal(t, subjects*seqs, results.Count(framework.Processed), "%v", results)
			require.Equal(t, subjects, results.Count(framework.DeadLettered), "%v", results)

			for subject := range subjects {
				id := fmt.Sprintf("a-%d-%d", round, subject)
				require.Equal(t, viewRow{Seq: seqs, Status: fmt.Sprintf("state %d", seqs), EventID: fmt.Sprintf("%s-e%d", id, seqs)},
					readView(t, s.kit.DB(), id))
			}
			if !postgres {
				return // SQLite has no transaction id to show the batches
			}
			var shared int
			require.NoError(t, s.kit.DB().Get(&shared, `SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM runs WHERE event_id LIKE $1 GROUP BY txid) AS per_tx`,
				fmt.Sprintf("a-%d-%%", round)))
			t.Logf("round %d: at most %d events in one transaction", round, shared)
			if shared > 1 {
				return
			}
		}
		t.Fatalf("no two events shared a transaction in %d rounds: group commit did not batch them", rounds)
	})
}
