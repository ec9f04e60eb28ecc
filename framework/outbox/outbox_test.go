package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// waitLimit bounds every wait; it fails only on a hang.
const waitLimit = 30 * time.Second

type store interface {
	driver.Store
}

// backend opens a migrated database of its kind and its store.
type backend struct {
	name     string
	postgres bool
	open     func(t testing.TB) (*sqlx.DB, store)
}

var backends = []backend{
	{"SQLite", false, func(t testing.TB) (*sqlx.DB, store) {
		db := testenv.SQLite(t)
		s, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		return db, s
	}},
	{"Postgres", true, func(t testing.TB) (*sqlx.DB, store) {
		db := testenv.Postgres(t)
		s, err := postgres.NewStore(db, postgres.StoreConfig{})
		require.NoError(t, err)
		return db, s
	}},
}

type noteV1 struct {
	Text string `json:"text" validate:"required"`
}

var noted = framework.Define[noteV1]("notes.note.added", 1)

// published is one message a recorder took.
type published struct {
	topic string
	msg   *message.Message
}

// recorder is a publisher that records what it takes. fail, when set,
// runs after a message was recorded (delivered) and may fail the call, as
// a broker whose confirm is lost.
type recorder struct {
	mu    sync.Mutex
	msgs  []published
	delay time.Duration
	fail  func(n int, msg *message.Message) error
}

var _ message.Publisher = (*recorder)(nil)

func (r *recorder) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		if r.delay > 0 {
			time.Sleep(r.delay)
		}
		r.mu.Lock()
		r.msgs = append(r.msgs, published{topic: topic, msg: msg})
		n := len(r.msgs)
		fail := r.fail
		r.mu.Unlock()
		if fail != nil {
			if err := fail(n, msg); err != nil {
				return err
			}
		}
	}
	return nil
}

func (r *recorder) Close() error { return nil }

func (r *recorder) all() []published {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]published(nil), r.msgs...)
}

func (r *recorder) ids() []string {
	var ids []string
	for _, p := range r.all() {
		ids = append(ids, p.msg.UUID)
	}
	return ids
}

// deferredRecorder is a recorder as an outbox.DeferredPublisher: each
// publish is recorded at once and confirmed by its wait.
type deferredRecorder struct{ *recorder }

var _ outbox.DeferredPublisher = deferredRecorder{}

func (d deferredRecorder) PublishDeferred(_ context.Context, topic string, msg *message.Message) (func(context.Context) error, error) {
	if err := d.Publish(topic, msg); err != nil {
		return nil, err
	}
	return func(context.Context) error { return nil }, nil
}

// bundle is one test's database, outbox and unit of work.
type bundle struct {
	backend backend
	db      *sqlx.DB
	store   store
	uow     *driver.UnitOfWork
	box     *outbox.Outbox
	pub     *recorder
}

func setup(t *testing.T, b backend) *bundle {
	t.Helper()
	db, s := b.open(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: s})
	require.NoError(t, err)
	box, err := outbox.New(db, outbox.Config{})
	require.NoError(t, err)
	return &bundle{backend: b, db: db, store: s, uow: uow, box: box, pub: &recorder{}}
}

func (bd *bundle) relay(t *testing.T, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := outbox.NewRelay(bd.db, bd.pub, cfg)
	require.NoError(t, err)
	return r
}

func env(t *testing.T, id string) framework.Envelope {
	t.Helper()
	e, err := noted.Envelope(noteV1{Text: "text of " + id}, framework.Attributes{ID: id, Source: "notes", Subject: "n-1"})
	require.NoError(t, err)
	return e
}

// attempt runs fn in a unit of work of an incoming event named id.
func (bd *bundle) attempt(t *testing.T, id string, fn func(ctx context.Context) error) error {
	t.Helper()
	_, err := bd.uow.Do(context.Background(), "notes.producer", framework.Key{Source: "in", ID: id}, fn)
	return err
}

func (bd *bundle) count(t *testing.T, query string) int {
	t.Helper()
	var n int
	require.NoError(t, bd.db.Get(&n, query))
	return n
}

func (bd *bundle) unsent(t *testing.T) int {
	return bd.count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`)
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testOutbox(t, b)
		})
	}
}

func testOutbox(t *testing.T, b backend) {
	ctx := context.Background()

	t.Run("CommittedIsPublishedOnce", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		want := env(t, "e-1")
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error { return bd.box.Add(ctx, want) }))
		relay := bd.relay(t, outbox.RelayConfig{})
		n, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, 1, n)
		n, err = relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "a sent row is not published again")

		got := bd.pub.all()
		require.Len(t, got, 1)
		require.Equal(t, noted.Type(), got[0].topic)
		require.Equal(t, "e-1", got[0].msg.UUID)
		require.Equal(t, framework.ContentType, got[0].msg.Metadata.Get(framework.MetadataContentType))
		decoded, err := driver.DecodeMessage(got[0].msg, framework.DefaultMaxBodyBytes)
		require.NoError(t, err)
		require.Equal(t, want.Key(), decoded.Key())
		require.Equal(t, "n-1", decoded.Subject)
		require.JSONEq(t, string(want.Data), string(decoded.Data))
		require.Zero(t, bd.unsent(t))
	})

	t.Run("RolledBackIsNeverPublished", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		boom := errors.New("handler failed after Add")
		err := bd.attempt(t, "in-1", func(ctx context.Context) error {
			require.NoError(t, bd.box.Add(ctx, env(t, "e-1")))
			return boom
		})
		require.ErrorIs(t, err, boom)
		n, err := bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
		require.Empty(t, bd.pub.all())
		require.Zero(t, bd.count(t, `SELECT count(*) FROM outbox`))
	})

	t.Run("AddWithoutTransaction", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.ErrorIs(t, bd.box.Add(ctx, env(t, "e-1")), outbox.ErrNoTx)
		require.ErrorIs(t, bd.box.AddTx(ctx, nil, env(t, "e-1")), outbox.ErrNoTx)

		tx, err := bd.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, bd.box.AddTx(ctx, tx, env(t, "e-2")))
		require.NoError(t, tx.Commit())
		_, err = bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"e-2"}, bd.pub.ids())
	})

	t.Run("SameEventTwiceIsOneRow", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			if err := bd.box.Add(ctx, env(t, "e-1"), env(t, "e-1")); err != nil {
				return err
			}
			return bd.box.Add(ctx, env(t, "e-1"))
		}))
		require.Equal(t, 1, bd.count(t, `SELECT count(*) FROM outbox`))
	})

	t.Run("SourceSpelledTwoWaysIsOneRow", func(t *testing.T) {
		// The spellings of a source that Decode reads alike are one
		// source: the row keeps the form its consumers key by, so the
		// event is added, and published, once.
		t.Parallel()
		bd := setup(t, b)
		spelled := func(source string) framework.Envelope {
			e := env(t, "e-1")
			e.Source = source
			return e
		}
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(ctx, spelled("café"), spelled("caf%C3%A9"), spelled("a b"))
		}))
		require.NoError(t, bd.attempt(t, "in-2", func(ctx context.Context) error {
			return bd.box.Add(ctx, spelled("a%20b"))
		}))
		var sources []string
		require.NoError(t, bd.db.Select(&sources, `SELECT source FROM outbox ORDER BY id`))
		require.Equal(t, []string{"caf%C3%A9", "a%20b"}, sources)
	})

	t.Run("InvalidEnvelope", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		bad := env(t, "e-1")
		bad.Type = ""
		err := bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(ctx, env(t, "e-2"), bad)
		})
		require.ErrorContains(t, err, "type: missing")
		require.Zero(t, bd.count(t, `SELECT count(*) FROM outbox`), "nothing of a rejected Add is written")
	})

	// An event its consumers would dead-letter as too_large is refused:
	// Add took events of 8 MiB, which every consumer refused.
	t.Run("TooLargeEnvelope", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		big, err := noted.Envelope(noteV1{Text: strings.Repeat("x", framework.DefaultMaxBodyBytes)}, framework.Attributes{ID: "e-big", Source: "notes"})
		require.NoError(t, err)
		err = bd.attempt(t, "in-1", func(ctx context.Context) error { return bd.box.Add(ctx, env(t, "e-2"), big) })
		require.Equal(t, framework.CodeTooLarge, framework.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, `outbox: add "notes/e-big": permanent (too_large): body: is `)
		require.Zero(t, bd.count(t, `SELECT count(*) FROM outbox`), "nothing of a rejected Add is written")
	})

	t.Run("RepublishedAfterCrashBetweenPublishAndMark", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(ctx, env(t, "e-1"), env(t, "e-2"), env(t, "e-3"))
		}))
		// The broker takes e-2, but its confirm is lost once.
		var once sync.Once
		bd.pub.fail = func(_ int, msg *message.Message) error {
			var err error
			if msg.UUID == "e-2" {
				once.Do(func() { err = errors.New("confirm lost") })
			}
			return err
		}
		relay := bd.relay(t, outbox.RelayConfig{})
		n, err := relay.PublishUnsent(ctx)
		require.ErrorContains(t, err, "confirm lost")
		require.Equal(t, 1, n, "e-1 is marked sent")
		n, err = relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, 2, n)
		require.Equal(t, []string{"e-1", "e-2", "e-2", "e-3"}, bd.pub.ids())

		// A consumer downstream sees one effect per event.
		_, err = bd.db.Exec(`CREATE TABLE effects (event_id TEXT NOT NULL)`)
		require.NoError(t, err)
		var outcomes []framework.Outcome
		for _, p := range bd.pub.all() {
			e, err := driver.DecodeMessage(p.msg, framework.DefaultMaxBodyBytes)
			require.NoError(t, err)
			o, err := bd.uow.Do(ctx, "notes.downstream", e.Key(), func(ctx context.Context) error {
				_, err := framework.Conn(ctx, bd.db).ExecContext(ctx, bd.db.Rebind(`INSERT INTO effects (event_id) VALUES (?)`), e.ID)
				return err
			})
			require.NoError(t, err)
			outcomes = append(outcomes, o)
		}
		require.Equal(t, []framework.Outcome{framework.Processed, framework.Processed, framework.Duplicate, framework.Processed}, outcomes)
		require.Equal(t, 3, bd.count(t, `SELECT count(*) FROM effects`))
	})

	t.Run("StoppedMidBatchRepublishesTheRest", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(ctx, env(t, "e-1"), env(t, "e-2"), env(t, "e-3"))
		}))
		runCtx, cancel := context.WithCancel(ctx)
		bd.pub.fail = func(n int, _ *message.Message) error {
			if n == 2 {
				cancel() // the process stops while e-2 is being published
			}
			return nil
		}
		relay := bd.relay(t, outbox.RelayConfig{})
		require.NoError(t, relay.Run(runCtx))
		require.Equal(t, []string{"e-1", "e-2"}, bd.pub.ids())
		require.Equal(t, 1, bd.unsent(t), "what was published is marked; the rest waits")

		bd.pub.fail = nil
		_, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, []string{"e-1", "e-2", "e-3"}, bd.pub.ids())
	})

	t.Run("SlowBatchMarksWhatWentOut", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		var want []string
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			for i := range 8 {
				want = append(want, fmt.Sprintf("e-%d", i))
				if err := bd.box.Add(ctx, env(t, want[i])); err != nil {
					return err
				}
			}
			return nil
		}))
		// A batch takes longer to publish than BatchTimeout: it stops
		// publishing then and marks what went out, so that the next
		// batches publish the rest, each row once, instead of publishing
		// the whole batch again at every poll.
		// The mark has at least BatchTimeout left (a batch's deadline is
		// twice it): a second, for a SQLite write under a loaded -race
		// run (400ms was once too short in a full make test). Each batch
		// publishes a row at least, so 8 polls publish all.
		bd.pub.delay = 250 * time.Millisecond
		relay := bd.relay(t, outbox.RelayConfig{BatchSize: 8, BatchTimeout: time.Second})
		for i := 0; i < 8 && bd.unsent(t) > 0; i++ {
			_, err := relay.PublishUnsent(ctx)
			require.NoError(t, err)
		}
		require.Zero(t, bd.unsent(t))
		require.Equal(t, want, bd.pub.ids())
	})

	t.Run("PublishesInIDOrder", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		var want []string
		for i := range 3 {
			require.NoError(t, bd.attempt(t, fmt.Sprintf("in-%d", i), func(ctx context.Context) error {
				for j := range 10 {
					id := fmt.Sprintf("e-%d-%02d", i, j)
					want = append(want, id)
					if err := bd.box.Add(ctx, env(t, id)); err != nil {
						return err
					}
				}
				return nil
			}))
		}
		n, err := bd.relay(t, outbox.RelayConfig{BatchSize: 7}).PublishUnsent(ctx)
		require.NoError(t, err)
		require.Equal(t, 30, n)
		require.Equal(t, want, bd.pub.ids())
	})

	// BatchBytes bounds what one batch reads: with bodies of size s and a
	// budget of 3.5 s, a batch reads 3 rows, whatever BatchSize allows;
	// a row larger than the budget goes out alone. Each publish counts
	// the rows published and not yet marked sent: those of its batch.
	for _, tc := range []struct {
		name      string
		budget    func(size int) int
		perBatch  int
		pipelined bool
	}{
		{"BatchBytesBoundsABatch", func(size int) int { return 3*size + size/2 }, 3, false},
		{"RowLargerThanBatchBytesGoesAlone", func(size int) int { return size / 2 }, 1, false},
		{"BatchBytesKeepsOrderWhilePipelined", func(size int) int { return 3*size + size/2 }, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bd := setup(t, b)
			const total = 20
			var want []string
			require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
				for i := range total {
					id := fmt.Sprintf("e-%02d", i)
					want = append(want, id)
					e, err := noted.Envelope(noteV1{Text: strings.Repeat("x", 1000)}, framework.Attributes{ID: id, Source: "notes"})
					require.NoError(t, err)
					if err := bd.box.Add(ctx, e); err != nil {
						return err
					}
				}
				return nil
			}))
			size := bd.count(t, `SELECT max(octet_length(body)) FROM outbox`)
			require.Less(t, size-bd.count(t, `SELECT min(octet_length(body)) FROM outbox`), 16, "the bodies differ in their time alone")

			var (
				mu       sync.Mutex
				most     int
				observed error
			)
			bd.pub.fail = func(n int, _ *message.Message) error {
				var sent int
				if err := bd.db.Get(&sent, `SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL`); err != nil {
					mu.Lock()
					observed = err
					mu.Unlock()
					return nil
				}
				mu.Lock()
				most = max(most, n-sent)
				mu.Unlock()
				return nil
			}
			var pub message.Publisher = bd.pub
			if tc.pipelined {
				pub = &deferredRecorder{bd.pub}
			}
			relay, err := outbox.NewRelay(bd.db, pub, outbox.RelayConfig{BatchSize: 10, BatchBytes: tc.budget(size)})
			require.NoError(t, err)
			n, err := relay.PublishUnsent(ctx)
			require.NoError(t, err)
			require.Equal(t, total, n, "one call publishes every row: a batch cut by bytes is not the last")
			require.Equal(t, want, bd.pub.ids(), "in id order, each once")
			require.Zero(t, bd.unsent(t))
			require.NoError(t, observed)
			if tc.perBatch > 0 {
				require.Equal(t, tc.perBatch, most, "rows a batch published before its marks")
			}
		})
	}

	// Two relays on one database, sharing an Outbox (one process) or not
	// (two processes).
	for _, shared := range []bool{true, false} {
		t.Run(fmt.Sprintf("TwoRelaysLoseNothing/SharedOutbox=%t", shared), func(t *testing.T) {
			t.Parallel()
			bd := setup(t, b)
			const total = 200
			for i := range total / 20 {
				require.NoError(t, bd.attempt(t, fmt.Sprintf("in-%d", i), func(ctx context.Context) error {
					for j := range 20 {
						if err := bd.box.Add(ctx, env(t, fmt.Sprintf("e-%03d", i*20+j))); err != nil {
							return err
						}
					}
					return nil
				}))
			}
			pubs := []*recorder{{delay: 100 * time.Microsecond}, {delay: 100 * time.Microsecond}}
			runCtx, cancel := context.WithCancel(ctx)
			var wg sync.WaitGroup
			for _, pub := range pubs {
				box := bd.box
				if !shared {
					var err error
					box, err = outbox.New(bd.db, outbox.Config{})
					require.NoError(t, err)
				}
				relay, err := outbox.NewRelay(bd.db, pub, outbox.RelayConfig{Outbox: box, BatchSize: 10, PollInterval: 5 * time.Millisecond})
				require.NoError(t, err)
				wg.Go(func() { require.NoError(t, relay.Run(runCtx)) })
			}
			deadline := time.Now().Add(waitLimit)
			for bd.unsent(t) > 0 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			cancel()
			wg.Wait()
			require.Zero(t, bd.unsent(t))

			seen := map[string]int{}
			for _, pub := range pubs {
				for _, id := range pub.ids() {
					seen[id]++
				}
			}
			require.Len(t, seen, total, "every row is published")
			dups := 0
			for _, n := range seen {
				dups += n - 1
			}
			t.Logf("%s: %d duplicates of %d rows (relay rows: %d, %d)", b.name, dups, total, len(pubs[0].ids()), len(pubs[1].ids()))
			require.Zero(t, dups, "rows one relay is publishing are not published by the other")
		})
	}

	if !b.postgres {
		t.Run("LeaseOfADeadRelayEnds", func(t *testing.T) {
			t.Parallel()
			bd := setup(t, b)
			require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
				return bd.box.Add(ctx, env(t, "e-1"))
			}))
			// A relay took its lease on the row, then its process died.
			held := time.Now().Add(time.Minute)
			_, err := bd.db.Exec(`UPDATE outbox SET claimed_until = ?`, held.UnixNano())
			require.NoError(t, err)
			n, err := bd.relay(t, outbox.RelayConfig{}).PublishUnsent(ctx)
			require.NoError(t, err)
			require.Zero(t, n, "a row under another relay's lease waits")

			later := bd.relay(t, outbox.RelayConfig{Now: func() time.Time { return held.Add(time.Second) }})
			n, err = later.PublishUnsent(ctx)
			require.NoError(t, err)
			require.Equal(t, 1, n, "once the lease ended, another relay publishes the row")
			require.Equal(t, []string{"e-1"}, bd.pub.ids())
		})
	}

	t.Run("Metrics", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			return bd.box.Add(ctx, env(t, "e-1"), env(t, "e-2"))
		}))
		reg := prometheus.NewRegistry()
		m, err := outbox.NewMetrics(reg)
		require.NoError(t, err)
		later := time.Now().Add(time.Minute) // the relay's clock runs ahead
		bd.pub.fail = func(_ int, msg *message.Message) error {
			if msg.UUID == "e-2" {
				return errors.New("broker down")
			}
			return nil
		}
		// runUntil runs a relay until cond holds of its metrics; a poll sets
		// the gauge last.
		runUntil := func(cond func() bool) {
			runCtx, cancel := context.WithCancel(ctx)
			relay := bd.relay(t, outbox.RelayConfig{Metrics: m, PollInterval: time.Hour, Now: func() time.Time { return later }})
			done := make(chan error, 1)
			go func() { done <- relay.Run(runCtx) }()
			require.Eventually(t, cond, waitLimit, 5*time.Millisecond)
			cancel()
			require.NoError(t, <-done)
		}
		runUntil(func() bool { return testutil.ToFloat64(m.OldestUnsent()) > 0 })
		require.InDelta(t, 1, testutil.ToFloat64(m.Published()), 0)
		require.InDelta(t, 1, testutil.ToFloat64(m.Failures()), 0)
		require.Greater(t, testutil.ToFloat64(m.OldestUnsent()), 30.0, "e-2 waits, a minute old by the relay's clock")

		bd.pub.fail = nil
		runUntil(func() bool { return testutil.ToFloat64(m.OldestUnsent()) == 0 })
		require.InDelta(t, 2, testutil.ToFloat64(m.Published()), 0)
	})

	t.Run("WakesAfterCommit", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		relay := bd.relay(t, outbox.RelayConfig{Outbox: bd.box, PollInterval: time.Hour})
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- relay.Run(runCtx) }()
		defer func() {
			cancel()
			require.NoError(t, <-done)
		}()
		require.Eventually(t, func() bool { return len(bd.pub.all()) == 0 }, waitLimit, time.Millisecond) // the first poll ran
		time.Sleep(20 * time.Millisecond)
		start := time.Now()
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			if err := bd.box.Add(ctx, env(t, "e-1")); err != nil {
				return err
			}
			time.Sleep(20 * time.Millisecond) // the commit comes later
			return nil
		}))
		require.Eventually(t, func() bool { return len(bd.pub.all()) == 1 }, 5*time.Second, time.Millisecond,
			"published long before the hour's poll")
		t.Logf("%s: published %s after the Add", b.name, time.Since(start))
	})

	t.Run("Cleanup", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		var (
			mu  sync.Mutex
			now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		)
		clock := func() time.Time {
			mu.Lock()
			defer mu.Unlock()
			return now
		}
		require.NoError(t, bd.attempt(t, "in-1", func(ctx context.Context) error {
			for i := range 5 {
				if err := bd.box.Add(ctx, env(t, fmt.Sprintf("e-%d", i))); err != nil {
					return err
				}
			}
			return nil
		}))
		relay := bd.relay(t, outbox.RelayConfig{Retention: time.Hour, CleanupBatchSize: 2, Now: clock})
		_, err := relay.PublishUnsent(ctx)
		require.NoError(t, err)
		require.NoError(t, bd.attempt(t, "in-2", func(ctx context.Context) error { return bd.box.Add(ctx, env(t, "unsent")) }))

		n, err := relay.Cleanup(ctx)
		require.NoError(t, err)
		require.Zero(t, n, "sent rows are kept for the retention")
		mu.Lock()
		now = now.Add(time.Hour + time.Second)
		mu.Unlock()
		n, err = relay.Cleanup(ctx)
		require.NoError(t, err)
		require.EqualValues(t, 5, n)
		require.Equal(t, 1, bd.count(t, `SELECT count(*) FROM outbox`))
		require.Equal(t, 1, bd.unsent(t), "unsent rows are never deleted")

		keep := bd.relay(t, outbox.RelayConfig{Retention: -1, Now: clock})
		n, err = keep.Cleanup(ctx)
		require.NoError(t, err)
		require.Zero(t, n)
	})

	t.Run("RunTwice", func(t *testing.T) {
		t.Parallel()
		bd := setup(t, b)
		relay := bd.relay(t, outbox.RelayConfig{PollInterval: time.Hour})
		runCtx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			// The probe below may hold the relay for a moment before this
			// Run starts: then this one is refused, and tries again.
			for {
				if err := relay.Run(runCtx); !errors.Is(err, outbox.ErrRunning) {
					done <- err
					return
				}
				runtime.Gosched()
			}
		}()
		ended, end := context.WithCancel(ctx)
		end() // a Run that gets to start returns at once
		require.Eventually(t, func() bool { return errors.Is(relay.Run(ended), outbox.ErrRunning) }, waitLimit, time.Millisecond)
		cancel()
		require.NoError(t, <-done)
	})
}

func TestConfig(t *testing.T) {
	t.Parallel()
	db := testenv.SQLite(t)
	_, err := outbox.New(nil, outbox.Config{})
	require.ErrorIs(t, err, outbox.ErrMissingDB)
	_, err = outbox.New(db, outbox.Config{TablePrefix: "Bad"})
	require.ErrorContains(t, err, "TablePrefix")
	_, err = outbox.NewRelay(db, nil, outbox.RelayConfig{})
	require.ErrorIs(t, err, outbox.ErrMissingPublisher)
	_, err = outbox.NewRelay(db, &recorder{}, outbox.RelayConfig{BatchSize: -1})
	require.ErrorContains(t, err, "BatchSize")
	_, err = outbox.NewRelay(db, &recorder{}, outbox.RelayConfig{BatchTimeout: outbox.MaxBatchTimeout + 1})
	require.ErrorContains(t, err, "BatchTimeout must be at most 24h0m0s")
	other := testenv.SQLite(t)
	box, err := outbox.New(other, outbox.Config{})
	require.NoError(t, err)
	_, err = outbox.NewRelay(db, &recorder{}, outbox.RelayConfig{Outbox: box})
	require.ErrorContains(t, err, "another database")

	cfg := outbox.RelayConfig{}.WithDefaults()
	require.Equal(t, outbox.DefaultPollInterval, cfg.PollInterval)
	require.Equal(t, outbox.DefaultBatchSize, cfg.BatchSize)
	require.Equal(t, outbox.DefaultRetention, cfg.Retention)
	require.NoError(t, cfg.Validate())
}
