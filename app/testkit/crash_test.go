package testkit_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

// What the crash tests consume: a projection of a subject's moves, one
// row per effect (no key, so that an effect applied twice shows as two
// rows), and a counter of the OnCommit hooks that ran.

type MovedV1 struct {
	To string `json:"to" validate:"required"`
}

var Moved = framework.Define[MovedV1]("parcels.parcel.moved", 1)

var effectsMigrations = fstest.MapFS{"00001_effects.sql": {Data: []byte(`-- +goose Up
CREATE TABLE effects (event_id TEXT NOT NULL, subject TEXT NOT NULL, seq INTEGER NOT NULL, place TEXT NOT NULL);
-- +goose Down
DROP TABLE effects;
`)}}

const trackName = "parcels.track-moves"

// Tracker records each move as an effect.
type Tracker struct {
	db *sqlx.DB
	// commits counts the OnCommit hooks that ran: one per effect that
	// committed and whose process lived on.
	commits atomic.Int64
	// refuse, when set, names a place the handler refuses permanently.
	refuse string
}

func (h *Tracker) Handle(ctx context.Context, ev framework.Event[MovedV1]) error {
	if ev.Data.To == h.refuse {
		return framework.Permanent("unknown_place", fmt.Errorf("no place %s", ev.Data.To))
	}
	tx, ok := driver.TxFromContext(ctx)
	if !ok {
		return fmt.Errorf("no transaction")
	}
	tx.OnCommit(func() { h.commits.Add(1) })
	_, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO effects (event_id, subject, seq, place) VALUES (?, ?, ?, ?)`),
		ev.ID, ev.Subject, ev.SubjectSeq, ev.Data.To)
	return err
}

type crashBundle struct {
	kit     *testkit.Kit
	tracker *Tracker
	chain   *testkit.Chain
}

func setupCrash(t *testing.T, cfg testkit.Config) *crashBundle {
	t.Helper()
	cfg.Migrations = effectsMigrations
	kit := testkit.New(t, cfg)
	h := &Tracker{db: kit.DB()}
	return &crashBundle{kit: kit, tracker: h, chain: kit.Chain(t, trackName, framework.Handle(Moved, h.Handle))}
}

// moved is the move of parcel p-1 numbered seq to place, with event id id.
func moved(t *testing.T, id string, seq int64, place string) framework.Envelope {
	t.Helper()
	return testkit.Envelope(t, Moved, MovedV1{To: place}, framework.Attributes{ID: id, Source: "parcels", Subject: "p-1", SubjectSeq: seq})
}

// effects counts the effects of event id.
func (b *crashBundle) effects(t *testing.T, id string) int {
	t.Helper()
	var n int
	require.NoError(t, b.kit.DB().Get(&n, b.kit.DB().Rebind(`SELECT count(*) FROM effects WHERE event_id = ?`), id))
	return n
}

// place returns where the projection has the parcel: the place of its
// latest effect.
func (b *crashBundle) place(t *testing.T) string {
	t.Helper()
	var p string
	require.NoError(t, b.kit.DB().Get(&p, `SELECT place FROM effects ORDER BY seq DESC LIMIT 1`))
	return p
}

// TestCrashPoints: a delivery that dies at each crash point leaves the
// effect of an event exactly once after its redelivery: processed when it
// died before the commit, a duplicate when it died after, on SQLite and
// PostgreSQL with group commit on. A death runs no OnCommit hook.
func TestCrashPoints(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		for _, tc := range []struct {
			at        testkit.CrashPoint
			committed bool // the effect committed before the death
			hooks     int  // the OnCommit hooks that ran before it
		}{
			{testkit.AfterDecode, false, 0},
			{testkit.AfterCount, false, 0},
			{testkit.AfterMark, false, 0},
			{testkit.BeforeCommit, false, 0},
			{testkit.AfterCommit, true, 0},
			{testkit.BeforeAck, true, 1}, // the unit of work was done
		} {
			t.Run(string(tc.at), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL})
				env := moved(t, "m-1", 1, "depot")

				res := b.chain.DeliverCrashing(ctx, t, env, tc.at)
				testkit.RequireCrashed(t, res, tc.at)
				require.False(t, res.Acked())
				committed := 0
				if tc.committed {
					committed = 1
				}
				require.Equal(t, committed, b.effects(t, env.ID), "effects after the death")
				require.EqualValues(t, tc.hooks, b.tracker.commits.Load(), "no OnCommit hook runs in a process that died")

				res = b.chain.Redeliver(ctx, t, env)
				if tc.committed {
					testkit.RequireDuplicate(t, res)
					require.EqualValues(t, tc.hooks, b.tracker.commits.Load())
				} else {
					testkit.RequireProcessed(t, res)
					require.EqualValues(t, 1, b.tracker.commits.Load())
				}
				require.Equal(t, 1, b.effects(t, env.ID), "one effect after the redelivery")
				testkit.RequireDuplicate(t, b.chain.Redeliver(ctx, t, env))
				require.Empty(t, b.chain.DeadLetters(ctx, t))
			})
		}
		t.Run(string(testkit.BeforeDeadLetter), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL})
			b.tracker.refuse = "nowhere"
			env := moved(t, "m-1", 1, "nowhere")

			testkit.RequireCrashed(t, b.chain.DeliverCrashing(ctx, t, env, testkit.BeforeDeadLetter), testkit.BeforeDeadLetter)
			require.Empty(t, b.chain.DeadLetters(ctx, t), "the dead letter was not stored")
			testkit.RequireDeadLettered(t, b.chain.Redeliver(ctx, t, env), "unknown_place")
			require.Len(t, b.chain.DeadLetters(ctx, t), 1)
		})
	})
}

// TestCrashUnreachedPointFails: DeliverCrashing fails the test when the
// delivery never passes the point: a duplicate has no mark to write.
func TestCrashUnreachedPointFails(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	b := setupCrash(t, testkit.Config{})
	env := moved(t, "m-1", 1, "depot")
	testkit.RequireProcessed(t, b.chain.Deliver(ctx, t, env))

	r := &recorder{TB: t}
	b.chain.DeliverCrashing(ctx, r, env, testkit.AfterMark)
	require.Contains(t, r.failure, "never reached crash point after_mark")
	require.Contains(t, r.failure, "duplicate")
}

// TestCrashKillsTheBatch: under group commit a death inside a batch kills
// every delivery of the batch, as a process death would: before the
// commit none of their effects is kept, after it all are and none is
// acknowledged; after the redeliveries each event has one effect.
func TestCrashKillsTheBatch(t *testing.T) {
	t.Parallel()
	const size = 4
	backends(t, func(t *testing.T, base testkit.Config) {
		for _, tc := range []struct {
			at        testkit.CrashPoint
			committed bool
		}{
			{testkit.AfterMark, false},
			{testkit.BeforeCommit, false},
			{testkit.AfterCommit, true},
		} {
			t.Run(string(tc.at), func(t *testing.T) {
				t.Parallel()
				ctx := t.Context()
				// The batch starts when it is full: the deliveries made
				// together share its transaction.
				b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL, Settings: middleware.Settings{BatchSize: size, BatchLinger: time.Hour, Timeout: 2 * time.Hour}})
				envs := make([]framework.Envelope, size)
				for i := range envs {
					envs[i] = moved(t, fmt.Sprintf("m-%d", i), int64(i+1), "depot")
				}
				// The third event dies; the hook sees every delivery.
				dying := envs[2].ID
				var seen atomic.Int64
				crashCtx := testkit.WithCrashHook(ctx, func(ctx context.Context, at testkit.CrashPoint) bool {
					env, _ := framework.EnvelopeFromContext(ctx)
					if at == tc.at {
						seen.Add(1)
					}
					return at == tc.at && env.ID == dying
				})

				for _, res := range b.chain.DeliverTogether(crashCtx, t, envs...) {
					testkit.RequireCrashed(t, res, tc.at)
				}
				require.Positive(t, seen.Load())
				want := 0
				if tc.committed {
					want = 1
				}
				for _, env := range envs {
					require.Equal(t, want, b.effects(t, env.ID), "effects of %s after the batch died", env.ID)
				}
				require.Zero(t, b.tracker.commits.Load(), "no OnCommit hook runs in a process that died")

				for _, res := range b.chain.DeliverTogether(ctx, t, envs...) { // delivered again

					if tc.committed {
						testkit.RequireDuplicate(t, res)
					} else {
						testkit.RequireProcessed(t, res)
					}
				}
				for _, env := range envs {
					require.Equal(t, 1, b.effects(t, env.ID), "effects of %s after the redeliveries", env.ID)
				}
			})
		}
	})
}

// TestCrashSkipStale: with skip_stale, a move that died before its commit
// is applied when it comes back, although a later move was applied
// meanwhile is not (its checkpoint rolled back with it); one that died
// after its commit comes back a duplicate, and an older copy of the
// subject's sequence is stale.
func TestCrashSkipStale(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		ctx := t.Context()
		b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL, Settings: middleware.Settings{SkipStale: true}})
		c := b.chain

		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-1", 1, "depot")))
		m3 := moved(t, "m-3", 3, "van")
		testkit.RequireCrashed(t, c.DeliverCrashing(ctx, t, m3, testkit.BeforeCommit), testkit.BeforeCommit)
		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-2", 2, "hub")))
		testkit.RequireProcessed(t, c.Redeliver(ctx, t, m3)) // 3 is newer than 2: applied
		require.Equal(t, "van", b.place(t))

		m4 := moved(t, "m-4", 4, "door")
		testkit.RequireCrashed(t, c.DeliverCrashing(ctx, t, m4, testkit.AfterCommit), testkit.AfterCommit)
		testkit.RequireDuplicate(t, c.Redeliver(ctx, t, m4))
		testkit.RequireStale(t, c.Deliver(ctx, t, moved(t, "m-3b", 3, "van"))) // another event, older than 4
		require.Equal(t, "door", b.place(t))
		for _, id := range []string{"m-1", "m-2", "m-3", "m-4"} {
			require.Equal(t, 1, b.effects(t, id), "effects of %s", id)
		}
	})
}

// TestCrashStrictOrder: with strict_order, a move that died before its
// commit leaves the subject's checkpoint where it was, so the next move
// waits (nacked) until the redelivery applies it; one that died after
// its commit moved the checkpoint, and its redelivery is a duplicate.
func TestCrashStrictOrder(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		ctx := t.Context()
		b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL, Settings: middleware.Settings{StrictOrder: true}})
		c := b.chain

		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-1", 1, "depot")))
		m2, m3 := moved(t, "m-2", 2, "hub"), moved(t, "m-3", 3, "van")
		testkit.RequireCrashed(t, c.DeliverCrashing(ctx, t, m2, testkit.BeforeCommit), testkit.BeforeCommit)
		testkit.RequireNacked(t, c.Deliver(ctx, t, m3)) // waits for 2
		testkit.RequireProcessed(t, c.Redeliver(ctx, t, m2))
		testkit.RequireCrashed(t, c.Redeliver(testkit.CrashAt(ctx, testkit.AfterCommit), t, m3), testkit.AfterCommit)
		testkit.RequireDuplicate(t, c.Redeliver(ctx, t, m3))
		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-4", 4, "door"))) // the checkpoint is at 3
		require.Equal(t, "door", b.place(t))
		for _, id := range []string{"m-1", "m-2", "m-3", "m-4"} {
			require.Equal(t, 1, b.effects(t, id), "effects of %s", id)
		}
	})
}

// TestCrashStrictOrderRelease: with strict_order, an event parked behind
// a dead letter and released once the dead letter is replayed, that
// fails and dies before its own dead letter is stored, stays parked: the
// parking is the only copy of its message, its delivery long
// acknowledged. The replay died with it, unacknowledged; after the
// restart its redelivery is a duplicate, the sweep releases the parked
// event again, and its dead letter holds the subject.
func TestCrashStrictOrderRelease(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		ctx := t.Context()
		b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL, Settings: middleware.Settings{StrictOrder: true}})
		c := b.chain
		parked := func() []string {
			t.Helper()
			ps, err := b.kit.Store().Parked(ctx, driver.ParkedFilter{Consumer: trackName})
			require.NoError(t, err)
			var out []string
			for _, p := range ps {
				out = append(out, fmt.Sprintf("%s held=%v", p.Key.ID, p.Held))
			}
			return out
		}

		b.tracker.refuse = "nowhere"
		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-1", 1, "depot")))
		testkit.RequireDeadLettered(t, c.Deliver(ctx, t, moved(t, "m-2", 2, "nowhere")), "unknown_place")
		testkit.RequireOutcome(t, c.Deliver(ctx, t, moved(t, "m-3", 3, "attic")), framework.Parked)
		testkit.RequireOutcome(t, c.Deliver(ctx, t, moved(t, "m-4", 4, "door")), framework.Parked)

		// "nowhere" is a place now, "attic" is not.
		b.tracker.refuse = "attic"
		dls := c.DeadLetters(ctx, t)
		require.Len(t, dls, 1)
		res := c.Replay(testkit.CrashAt(ctx, testkit.BeforeDeadLetter), t, dls[0])
		testkit.RequireCrashed(t, res, testkit.BeforeDeadLetter)
		require.Equal(t, 1, b.effects(t, "m-2"), "the replay took effect before m-3 died")
		require.Len(t, c.DeadLetters(ctx, t), 1, "m-3's dead letter was not stored")
		require.Equal(t, []string{"m-3 held=false", "m-4 held=false"}, parked(), "m-3 stays parked, whole")

		restarted := b.kit.Chain(t, trackName, framework.Handle(Moved, b.tracker.Handle))
		testkit.RequireDuplicate(t, restarted.Redeliver(ctx, t, moved(t, "m-2", 2, "nowhere")))
		// The restarted chain's sweep runs at once, on its own goroutine
		// (see middleware.Handler), or with the redelivery: either may
		// release m-3.
		require.EventuallyWithT(t, func(c *assert.CollectT) {
			assert.Equal(c, []string{"m-3 held=true", "m-4 held=false"}, parked(), "the sweep released m-3: a dead letter now")
		}, 10*time.Second, 10*time.Millisecond)
		dls = restarted.DeadLetters(ctx, t)
		require.Len(t, dls, 2)
		require.Equal(t, "m-3", dls[1].EventID)
		require.Equal(t, framework.Code("unknown_place"), dls[1].Code)

		b.tracker.refuse = ""
		testkit.RequireProcessed(t, restarted.Replay(ctx, t, dls[1]))
		require.Empty(t, parked())
		require.Equal(t, "door", b.place(t))
		for _, id := range []string{"m-1", "m-2", "m-3", "m-4"} {
			require.Equal(t, 1, b.effects(t, id), "effects of %s", id)
		}
	})
}

// TestChainSweeps: a chain's sweep runs on its own, as in a service (see
// middleware.Handler): an event parked behind a dead letter whose replay
// died after its commit, before it released the event, is applied by the
// sweep of a chain built afterwards, with no message delivered to it.
func TestChainSweeps(t *testing.T) {
	t.Parallel()
	backends(t, func(t *testing.T, base testkit.Config) {
		ctx := t.Context()
		b := setupCrash(t, testkit.Config{PostgresURL: base.PostgresURL, Settings: middleware.Settings{StrictOrder: true}})
		c := b.chain
		b.tracker.refuse = "nowhere"
		testkit.RequireProcessed(t, c.Deliver(ctx, t, moved(t, "m-1", 1, "depot")))
		testkit.RequireDeadLettered(t, c.Deliver(ctx, t, moved(t, "m-2", 2, "nowhere")), "unknown_place")
		testkit.RequireOutcome(t, c.Deliver(ctx, t, moved(t, "m-3", 3, "attic")), framework.Parked)
		b.tracker.refuse = ""
		dls := c.DeadLetters(ctx, t)
		require.Len(t, dls, 1)
		testkit.RequireCrashed(t, c.Replay(testkit.CrashAt(ctx, testkit.AfterCommit), t, dls[0]), testkit.AfterCommit)
		require.Equal(t, 1, b.effects(t, "m-2"))
		require.Zero(t, b.effects(t, "m-3"), "m-3 waits in its parking")

		b.kit.Chain(t, trackName, framework.Handle(Moved, b.tracker.Handle))
		require.Eventually(t, func() bool { return b.effects(t, "m-3") == 1 }, 10*time.Second, 10*time.Millisecond,
			"the new chain's sweep applied m-3")
		require.Equal(t, "attic", b.place(t))
	})
}
