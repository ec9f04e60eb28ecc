package main

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// databases are where the tests run: SQLite, and PostgreSQL from the
// environment.
func databases(t *testing.T) map[string]string {
	t.Helper()
	return map[string]string{"SQLite": "", "PostgreSQL": testenv.Require(t, testenv.PostgresURLVar)}
}

// note returns the body of a NoteAdded event with id, carrying tenant in
// the CloudEvents extension tenant (none when tenant is empty).
func note(t *testing.T, id, tenant string) []byte {
	t.Helper()
	env, err := NoteAdded.Envelope(NoteAddedV1{NoteID: id, Text: "text of " + id}, framework.Attributes{ID: "evt-" + id, Source: "notes"})
	require.NoError(t, err)
	body, err := framework.Encode(env)
	require.NoError(t, err)
	if tenant == "" {
		return body
	}
	var ev map[string]any
	require.NoError(t, json.Unmarshal(body, &ev))
	ev["tenant"] = tenant
	body, err = json.Marshal(ev)
	require.NoError(t, err)
	return body
}

// rows returns the rows of query, each as its columns joined by "/".
func rows(t *testing.T, db *sqlx.DB, query string) []string {
	t.Helper()
	var out []string
	require.NoError(t, db.SelectContext(t.Context(), &out, query))
	return out
}

// TestRequireTenant: the service dead-letters an event without a tenant,
// or with one that is no tenant name, with code missing_tenant before any
// attempt, and records an event with a tenant, with its audit row.
func TestRequireTenant(t *testing.T) {
	t.Parallel()
	for name, pgURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc := apptest.New(t, Module, apptest.Config{PostgresURL: pgURL})
			for _, body := range [][]byte{note(t, "n0", ""), note(t, "n1", "Not A Tenant")} {
				res, err := svc.DeliverBody(t.Context(), Consumer, body)
				require.NoError(t, err)
				require.Equal(t, framework.DeadLettered, res.Outcome, "%s", res)
				require.Equal(t, CodeMissingTenant, res.Code)
				require.Zero(t, res.Attempts, "refused around the attempts")
			}
			res, err := svc.DeliverBody(t.Context(), Consumer, note(t, "n2", "acme"))
			require.NoError(t, err)
			require.Equal(t, framework.Processed, res.Outcome, "%s", res)

			require.Equal(t, []string{"acme/n2"}, rows(t, svc.DB(), `SELECT tenant || '/' || note_id FROM notes`))
			require.Equal(t, []string{"acme/notes/evt-n2/notes.note.added"},
				rows(t, svc.DB(), `SELECT tenant || '/' || source || '/' || event_id || '/' || type FROM audit_log`))
		})
	}
}

// checker is the handler of the tests' own consumer: it records notes as
// the service does, but refuses the note "bad" (permanent) and fails the
// first run of the note "flaky" (retried).
type checker struct {
	record framework.HandlerFunc[NoteAddedV1]
	mu     sync.Mutex
	failed bool
}

const checkConsumer = "notes.check-note"

func (c *checker) Handle(ctx context.Context, ev framework.Event[NoteAddedV1]) error {
	switch ev.Data.NoteID {
	case "bad":
		return framework.Permanent("rejected_note", errors.New("rejected"))
	case "flaky":
		c.mu.Lock()
		first := !c.failed
		c.failed = true
		c.mu.Unlock()
		if first {
			return errors.New("flaky")
		}
	}
	return c.record(ctx, ev)
}

// checkModule is the service's middleware and migrations with the tests'
// consumer, and Inner middleware of the test's own around SetTenant.
func checkModule(around ...message.HandlerMiddleware) fx.Option {
	inner := Middleware.Inner
	if len(around) == 2 {
		inner = []message.HandlerMiddleware{around[0], SetTenant, around[1], Audit}
	}
	return fx.Options(
		fx.Supply(app.Middleware{Outer: Middleware.Outer, Inner: inner}),
		fx.Provide(Migrations),
		handlers.Register(checkConsumer, handlers.On(NoteAdded, func(db *sqlx.DB) *checker {
			return &checker{record: NewRecordNote(db)}
		})),
	)
}

// TestAuditCommitsWithEffect: the audit row commits with the handler's
// effect: a failing handler leaves none, a retried one leaves one.
func TestAuditCommitsWithEffect(t *testing.T) {
	t.Parallel()
	for name, pgURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			svc := apptest.New(t, checkModule(), apptest.Config{PostgresURL: pgURL})
			for _, tc := range []struct {
				id       string
				outcome  framework.Outcome
				attempts int
			}{
				{"bad", framework.DeadLettered, 1},
				{"flaky", framework.Processed, 2},
				{"good", framework.Processed, 1},
			} {
				res, err := svc.DeliverBody(t.Context(), checkConsumer, note(t, tc.id, "acme"))
				require.NoError(t, err)
				require.Equal(t, tc.outcome, res.Outcome, "%s: %s", tc.id, res)
				require.Equal(t, tc.attempts, res.Attempts, "%s: %s", tc.id, res)
			}
			require.Equal(t, []string{"evt-flaky", "evt-good"}, rows(t, svc.DB(), `SELECT event_id FROM audit_log ORDER BY event_id`))
			require.Equal(t, []string{"flaky", "good"}, rows(t, svc.DB(), `SELECT note_id FROM notes ORDER BY note_id`))
		})
	}
}

// seen is what a probe saw in one run of an attempt.
type seen struct{ txid, tenant string }

// probes record, per event id, what the last run of its attempt saw
// before SetTenant and after it, on PostgreSQL.
type probes struct {
	mu            sync.Mutex
	before, after map[string]seen
}

// probe is Inner middleware that records into m what the attempt's
// transaction is and which tenant it has set.
func (p *probes) probe(m map[string]seen) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			ctx := msg.Context()
			tx, _ := driver.TxFromContext(ctx)
			d, _ := framework.EnvelopeFromContext(ctx)
			if tx.DriverName() == "pgx" {
				var s seen
				if err := tx.QueryRowxContext(ctx, `SELECT txid_current()::text, coalesce(current_setting('app.tenant', true), '')`).Scan(&s.txid, &s.tenant); err != nil {
					return nil, err
				}
				p.mu.Lock()
				m[d.ID] = s
				p.mu.Unlock()
			}
			return next(msg)
		}
	}
}

// TestTenantPerAttempt: three events of three tenants share one batch
// (group commit), and one of them fails: the batch rolls back and the two
// others commit together in a new transaction. On PostgreSQL each
// attempt starts without a tenant and sees its own once SetTenant ran,
// never its batch-mate's; on both databases each of the two has one
// audit row and one note, under its own tenant, and the failed one none.
func TestTenantPerAttempt(t *testing.T) {
	t.Parallel()
	for name, pgURL := range databases(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := &probes{before: map[string]seen{}, after: map[string]seen{}}
			// The batch starts when it holds three attempts (or after a
			// minute, which would fail the test); a linger must be
			// shorter than the attempts' timeout.
			together := middleware.Settings{
				Concurrency: 3, BatchSize: 3, Batches: 1,
				BatchLinger: time.Minute, Timeout: 2 * time.Minute,
			}
			svc := apptest.New(t, checkModule(p.probe(p.before), p.probe(p.after)), apptest.Config{
				PostgresURL: pgURL,
				Consumers:   map[string]middleware.Settings{checkConsumer: together},
			})
			tenants := map[string]string{"n1": "acme", "n2": "globex", "bad": "initech"}
			results := map[string]testkit.Result{}
			var mu sync.Mutex
			var wg sync.WaitGroup
			for id, tenant := range tenants {
				wg.Go(func() {
					res, err := svc.DeliverBody(t.Context(), checkConsumer, note(t, id, tenant))
					if err != nil {
						res.Err = err
					}
					mu.Lock()
					results[id] = res
					mu.Unlock()
				})
			}
			wg.Wait()
			require.Equal(t, framework.Processed, results["n1"].Outcome, "%s", results["n1"])
			require.Equal(t, framework.Processed, results["n2"].Outcome, "%s", results["n2"])
			require.Equal(t, framework.DeadLettered, results["bad"].Outcome, "%s", results["bad"])

			require.Equal(t, []string{"acme/evt-n1", "globex/evt-n2"}, rows(t, svc.DB(), `SELECT tenant || '/' || event_id FROM audit_log ORDER BY event_id`))
			require.Equal(t, []string{"acme/n1", "globex/n2"}, rows(t, svc.DB(), `SELECT tenant || '/' || note_id FROM notes ORDER BY note_id`))
			if pgURL == "" {
				return
			}
			p.mu.Lock()
			defer p.mu.Unlock()
			require.Equal(t, p.before["evt-n1"].txid, p.before["evt-n2"].txid, "one batch, one transaction")
			for _, id := range []string{"n1", "n2"} {
				require.Empty(t, p.before["evt-"+id].tenant, "%s starts without a tenant", id)
				require.Equal(t, tenants[id], p.after["evt-"+id].tenant, "%s sees its own tenant", id)
			}
		})
	}
}
