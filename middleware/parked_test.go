package middleware_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/middleware"
)

// ordered is a strict-order consumer on one database whose handler
// refuses, once, the events listed in refuse, and checks that each event
// of a subject takes effect right after the one before it.
type ordered struct {
	db     *sqlx.DB
	store  driver.Store
	uow    *driver.UnitOfWork
	c      *framework.Consumer
	refuse sync.Map       // event id -> struct{}: refused once, permanently
	code   framework.Code // of a refusal; "refused" when empty
}

func newOrdered(t *testing.T, b backend) *ordered {
	t.Helper()
	db, s := b.open(t, nil)
	return newOrderedOn(t, db, s)
}

// newOrderedOn is newOrdered on the database db of store s.
func newOrderedOn(t *testing.T, db *sqlx.DB, s driver.Store) *ordered {
	t.Helper()
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	_, err := db.Exec(`CREATE TABLE effects (source TEXT NOT NULL, event_id TEXT NOT NULL, text TEXT NOT NULL, subject TEXT NOT NULL, seq BIGINT NOT NULL)`)
	require.NoError(t, err)
	o := &ordered{db: db, store: s}
	o.c, err = framework.NewConsumer(consumerName, framework.Handle(noted, func(ctx context.Context, ev framework.Event[noteV1]) error {
		if _, refuse := o.refuse.LoadAndDelete(ev.ID); refuse {
			code := o.code
			if code == "" {
				code = "refused"
			}
			return framework.Permanent(code, errors.New("refused once"))
		}
		// The oracle: no effect of the subject at or after the event's
		// step. It reads the effects, not the framework's checkpoints: a
		// batch may move those before its handlers run.
		var last int64
		if err := sqlx.GetContext(ctx, framework.Conn(ctx, db), &last,
			db.Rebind(`SELECT COALESCE(max(seq), 0) FROM effects WHERE subject = ?`), ev.Subject); err != nil {
			return err
		}
		if last >= ev.SubjectSeq {
			return framework.Permanent("out_of_order", fmt.Errorf("#%d after #%d", ev.SubjectSeq, last))
		}
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO effects (source, event_id, text, subject, seq) VALUES (?, ?, ?, ?, ?)`),
			ev.Source, ev.ID, ev.Data.Text, ev.Subject, ev.SubjectSeq)
		return err
	}))
	require.NoError(t, err)
	// Group commit: the default batch size.
	o.uow, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: s})
	require.NoError(t, err)
	return o
}

// handler returns the consumer's chain on store (a process of the
// service: a new one is a restart). Its subjects start at the first event
// seen (s4), as a consumer's that joins a stream does.
func (o *ordered) handler(t *testing.T, store driver.Store) message.NoPublishHandlerFunc {
	t.Helper()
	h, _, err := middleware.Handler(middleware.Config{
		Consumer: o.c, UnitOfWork: o.uow, Store: store, Settings: middleware.Settings{
			StrictOrder:        true,
			OrderFromFirstSeen: true,
			Attempts:           2,
		},
	})
	require.NoError(t, err)
	return h
}

// deliver hands an event of subject with sequence n to h and returns
// what became of it.
func deliver(t *testing.T, h message.NoPublishHandlerFunc, id, subject string, n int64) framework.Outcome {
	t.Helper()
	env, err := noted.Envelope(noteV1{Text: id}, framework.Attributes{ID: id, Source: "notes", Subject: subject, SubjectSeq: n})
	require.NoError(t, err)
	msg := message.NewMessage(watermill.NewUUID(), body(t, env))
	require.NoError(t, h(msg), id)
	r, ok := middleware.ReportOf(msg)
	require.True(t, ok)
	return r.Outcome
}

func (o *ordered) applied(t *testing.T, prefix string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, o.db.Select(&ids, o.db.Rebind(`SELECT event_id FROM effects WHERE event_id LIKE ? ORDER BY event_id`), prefix+"%"))
	return ids
}

func (o *ordered) parked(t *testing.T) []string {
	t.Helper()
	ps, err := o.store.Parked(context.Background(), driver.ParkedFilter{Consumer: consumerName})
	require.NoError(t, err)
	var out []string
	for _, p := range ps {
		s := p.Key.ID
		if p.Held {
			s += " held"
		}
		out = append(out, s)
	}
	return out
}

// deadLetters returns the consumer's dead letters of event id.
func (o *ordered) deadLetters(t *testing.T, id string) []driver.DeadLetter {
	t.Helper()
	dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	var out []driver.DeadLetter
	for _, dl := range dls {
		if dl.EventID == id {
			out = append(out, dl)
		}
	}
	return out
}

func (o *ordered) marked(t *testing.T, id string) bool {
	t.Helper()
	var n int
	require.NoError(t, o.db.Get(&n, o.db.Rebind(`SELECT count(*) FROM processed_events WHERE event_id = ?`), id))
	return n == 1
}

// parkBehindDeadLetter delivers s4, then s5, which is dead-lettered, then
// s6 and s7, which are parked behind it.
func (o *ordered) parkBehindDeadLetter(t *testing.T, h message.NoPublishHandlerFunc) driver.DeadLetter {
	t.Helper()
	o.refuse.Store("s5", struct{}{})
	require.Equal(t, framework.Processed, deliver(t, h, "s4", "S", 4))
	require.Equal(t, framework.DeadLettered, deliver(t, h, "s5", "S", 5))
	require.Equal(t, framework.Parked, deliver(t, h, "s7", "S", 7))
	require.Equal(t, framework.Parked, deliver(t, h, "s6", "S", 6))
	require.Equal(t, framework.Parked, deliver(t, h, "s7", "S", 7), "a copy is parked again")
	require.Equal(t, []string{"s5 held", "s6", "s7"}, o.parked(t))
	require.False(t, o.marked(t, "s6"), "a parked event is not marked processed")
	require.False(t, o.marked(t, "s7"))
	dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	require.Len(t, dls, 1, "no sequence_gap dead letter")
	require.Equal(t, "s5", dls[0].EventID)
	require.Equal(t, []string{"s4"}, o.applied(t, "s"))
	return dls[0]
}

// skipAndRelease skips dl, the dead letter s5 that parkBehindDeadLetter
// left holding S, as the operator's release does, and hands the first
// parked event to h again: it applies, and releases the rest.
func (o *ordered) skipAndRelease(t *testing.T, h message.NoPublishHandlerFunc, dl driver.DeadLetter) {
	t.Helper()
	seq, err := o.store.Skip(context.Background(), consumerName, "S", dl.Key())
	require.NoError(t, err)
	require.Equal(t, int64(5), seq)
	require.Equal(t, framework.Processed, deliver(t, h, "s6", "S", 6))
	require.Equal(t, []string{"s4", "s6", "s7"}, o.applied(t, "s"))
	require.Empty(t, o.parked(t))
}

// redeliver hands the dead letter's message to h again, as a replay does.
func redeliver(t *testing.T, h message.NoPublishHandlerFunc, dl driver.DeadLetter) framework.Outcome {
	t.Helper()
	msg := dl.ReplayMessage()
	require.NoError(t, h(msg))
	r, ok := middleware.ReportOf(msg)
	require.True(t, ok)
	return r.Outcome
}

func TestStrictOrderParksBehindDeadLetter(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()

			t.Run("ReplayAppliesTheParkedInOrder", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)

				// Another subject progresses while S is replayed.
				var wg sync.WaitGroup
				wg.Go(func() {
					for n := int64(1); n <= 5; n++ {
						require.Equal(t, framework.Processed, deliver(t, h, fmt.Sprintf("t%d", n), "T", n))
					}
				})
				require.Equal(t, framework.Processed, redeliver(t, h, dl))
				wg.Wait()

				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"), "each once, in order (else out_of_order)")
				require.Equal(t, []string{"t1", "t2", "t3", "t4", "t5"}, o.applied(t, "t"))
				require.Empty(t, o.parked(t))
				require.True(t, o.marked(t, "s6"))
				require.True(t, o.marked(t, "s7"))
				require.Equal(t, framework.Duplicate, deliver(t, h, "s7", "S", 7))
				require.Equal(t, framework.Processed, deliver(t, h, "s8", "S", 8))
			})

			// Two events of S claim #6 (a producer's mistake): the one
			// parked first keeps its place and its message; the other
			// is a dead letter, sequence_conflict, that holds nothing.
			// Once the first took effect, a replay of the other is
			// stale, as any event at or below the checkpoint.
			t.Run("SecondEventOfOneSequenceIsADeadLetter", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)
				require.Equal(t, framework.DeadLettered, deliver(t, h, "s6-again", "S", 6))
				require.Equal(t, []string{"s5 held", "s6", "s7"}, o.parked(t), "s6 is parked, whole")
				dls := o.deadLetters(t, "s6-again")
				require.Len(t, dls, 1)
				require.Equal(t, framework.CodeSequenceConflict, dls[0].Code)
				require.False(t, o.marked(t, "s6-again"))

				require.Equal(t, framework.Processed, redeliver(t, h, dl))
				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"), "the first s6 took effect")
				require.Empty(t, o.parked(t))
				require.Equal(t, framework.Stale, redeliver(t, h, dls[0]))
				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"))
			})

			// The other order: s6 is parked and its turn has come (s5
			// took effect), but it is not released yet, when another
			// event with #6 comes. It would take s6's step, and s6's
			// parked row, the only copy of its message, would go with
			// it: it is a sequence_conflict dead letter instead, its
			// effect rolled back, and s6 takes effect when released.
			t.Run("AnotherEventAtAParkedOnesTurnIsADeadLetter", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)
				unreleased := o.handler(t, hiddenParked{o.store})
				require.Equal(t, framework.Processed, redeliver(t, unreleased, dl))
				require.Equal(t, []string{"s4", "s5"}, o.applied(t, "s"))
				require.Equal(t, []string{"s6", "s7"}, o.parked(t), "s6's turn, not released")

				require.Equal(t, framework.DeadLettered, deliver(t, unreleased, "s6-again", "S", 6))
				dls := o.deadLetters(t, "s6-again")
				require.Len(t, dls, 1)
				require.Equal(t, framework.CodeSequenceConflict, dls[0].Code)
				require.Equal(t, []string{"s4", "s5"}, o.applied(t, "s"), "s6-again's effect rolled back")
				require.Equal(t, []string{"s6", "s7"}, o.parked(t), "s6 keeps its place")

				restarted := o.handler(t, o.store)
				require.Equal(t, framework.Processed, deliver(t, restarted, "t1", "T", 1), "its sweep at start releases s6")
				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"))
				require.Empty(t, o.parked(t))
				require.Equal(t, framework.Stale, redeliver(t, restarted, dls[0]))
			})

			// A handler's own permanent error with the code sequence_gap
			// holds the subject too: only the end of a wait does not.
			t.Run("HandlerCodeSequenceGapHolds", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				o.code = framework.CodeSequenceGap
				h := o.handler(t, o.store)
				o.refuse.Store("s2", struct{}{})
				require.Equal(t, framework.Processed, deliver(t, h, "s1", "S", 1))
				require.Equal(t, framework.DeadLettered, deliver(t, h, "s2", "S", 2))
				require.Equal(t, framework.Parked, deliver(t, h, "s3", "S", 3), "parked behind s2, not waiting for it")
				require.Equal(t, []string{"s2 held", "s3"}, o.parked(t))
				dls := o.deadLetters(t, "s2")
				require.Len(t, dls, 1)
				require.Equal(t, framework.Processed, redeliver(t, h, dls[0]))
				require.Equal(t, []string{"s1", "s2", "s3"}, o.applied(t, "s"))
				require.Empty(t, o.parked(t))
			})

			t.Run("ReleasedEventThatFailsParksTheRestAgain", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)
				o.refuse.Store("s6", struct{}{})
				require.Equal(t, framework.Processed, redeliver(t, h, dl))
				require.Equal(t, []string{"s4", "s5"}, o.applied(t, "s"))
				require.Equal(t, []string{"s6 held", "s7"}, o.parked(t), "s6 is a dead letter now, s7 waits behind it")

				dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName, Code: "refused"})
				require.NoError(t, err)
				require.Len(t, dls, 2)
				require.Equal(t, "s6", dls[1].EventID)
				require.Equal(t, framework.Processed, redeliver(t, h, dls[1]))
				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"))
				require.Empty(t, o.parked(t))
			})

			t.Run("ReleasedEventWhoseDeadLetterFailsStaysParked", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)

				// s6 is released and refused, and its dead letter is
				// not stored: the process died on the way, or the
				// database went away. The parked event is the only
				// copy of its message (its delivery was acknowledged):
				// it stays parked, whole, and is not held.
				o.refuse.Store("s6", struct{}{})
				failing := o.handler(t, &failingDeadLetter{Store: o.store, id: "s6"})
				require.Equal(t, framework.Processed, deliver(t, failing, "t1", "T", 1), "its sweep at start finds nothing")
				require.Equal(t, framework.Processed, redeliver(t, failing, dl))
				require.Equal(t, []string{"s4", "s5"}, o.applied(t, "s"))
				require.Equal(t, []string{"s6", "s7"}, o.parked(t), "s6 parked still, not held without its dead letter")
				require.Empty(t, o.deadLetters(t, "s6"))

				// After the restart, the sweep of its first message
				// releases s6 again, refused again: its dead letter
				// holds the subject now.
				o.refuse.Store("s6", struct{}{})
				restarted := o.handler(t, o.store)
				require.Equal(t, framework.Processed, deliver(t, restarted, "t2", "T", 2))
				require.Equal(t, []string{"s6 held", "s7"}, o.parked(t))
				dls := o.deadLetters(t, "s6")
				require.Len(t, dls, 1)
				require.Equal(t, "S", dls[0].Subject)
				require.EqualValues(t, 6, dls[0].SubjectSeq)
				require.Equal(t, framework.Processed, redeliver(t, restarted, dls[0]))
				require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"))
				require.Empty(t, o.parked(t))
			})

			t.Run("SkippedDeadLetterReleasesOnTheNextOfItsSubject", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)
				o.skipAndRelease(t, h, dl)
				require.Equal(t, framework.Duplicate, deliver(t, h, "s7", "S", 7), "s7 took effect")
			})

			// A discarded dead letter is final (see driver.Store.Mark):
			// a copy of its event that the handler would now apply is
			// a duplicate, which neither moves the subject's checkpoint
			// nor releases the events parked behind it; the operator's
			// release (Skip) does.
			t.Run("CopyOfDiscardedDeadLetterTakesNoEffect", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				h := o.handler(t, o.store)
				dl := o.parkBehindDeadLetter(t, h)
				_, err := o.store.ResolveDeadLetter(context.Background(), dl.ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops"})
				require.NoError(t, err)
				require.Equal(t, framework.Duplicate, deliver(t, h, "s5", "S", 5))
				require.Equal(t, framework.Duplicate, redeliver(t, h, dl), "the dead letter's own message too")
				require.Equal(t, []string{"s4"}, o.applied(t, "s"))
				require.Equal(t, []string{"s5 held", "s6", "s7"}, o.parked(t), "still parked")
				got, err := o.store.DeadLetter(context.Background(), dl.ID)
				require.NoError(t, err)
				require.Equal(t, driver.DeadLetterDiscarded, got.Status)

				o.skipAndRelease(t, h, dl)
				require.Equal(t, framework.Duplicate, deliver(t, h, "s5", "S", 5), "skipped and discarded")
			})

			t.Run("DeadLetterWaitsForItsHold", func(t *testing.T) {
				t.Parallel()
				o := newOrdered(t, b)
				failing := &failingHold{Store: o.store}
				h := o.handler(t, failing)
				o.refuse.Store("s5", struct{}{})
				require.Equal(t, framework.Processed, deliver(t, h, "s4", "S", 4))
				env, err := noted.Envelope(noteV1{Text: "s5"}, framework.Attributes{ID: "s5", Source: "notes", Subject: "S", SubjectSeq: 5})
				require.NoError(t, err)
				require.ErrorIs(t, h(message.NewMessage(watermill.NewUUID(), body(t, env))), errHoldFailed,
					"nacked: not dead-lettered without the hold that parks the events behind it")
				dls, err := o.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumerName})
				require.NoError(t, err)
				require.Empty(t, dls)

				o.refuse.Store("s5", struct{}{})
				require.Equal(t, framework.DeadLettered, deliver(t, o.handler(t, o.store), "s5", "S", 5), "delivered again, with the hold")
				require.Equal(t, []string{"s5 held"}, o.parked(t))
			})

			t.Run("CrashBeforeTheReleaseLosesNothing", func(t *testing.T) {
				t.Parallel()
				for _, crashAt := range []int64{1, 2} {
					t.Run(fmt.Sprint("Release", crashAt), func(t *testing.T) {
						t.Parallel()
						o := newOrdered(t, b)
						h := o.handler(t, o.store)
						dl := o.parkBehindDeadLetter(t, h)

						// The process dies before it looks for the
						// crashAt-th event to release: after the effect
						// of s5 (1), or of s6 (2).
						crashing := &crashBeforeRelease{Store: o.store, at: crashAt}
						require.Equal(t, framework.Processed, redeliver(t, o.handler(t, crashing), dl))
						require.Equal(t, []string{"s4", "s5", "s6", "s7"}[:crashAt+1], o.applied(t, "s"))
						require.NotEmpty(t, o.parked(t), "what was not released stays parked")

						// After the restart, its first message of any
						// subject releases them.
						restarted := o.handler(t, o.store)
						require.Equal(t, framework.Processed, deliver(t, restarted, "t1", "T", 1))
						require.Equal(t, []string{"s4", "s5", "s6", "s7"}, o.applied(t, "s"))
						require.Empty(t, o.parked(t))
					})
				}
			})
		})
	}
}

// crashBeforeRelease is a store whose process dies when the release looks
// for a parked event the at-th time: that call and every later one fails.
type crashBeforeRelease struct {
	driver.Store
	at    int64
	calls atomic.Int64
}

var errCrashed = errors.New("the process died")

func (s *crashBeforeRelease) Parked(ctx context.Context, f driver.ParkedFilter) ([]driver.ParkedEvent, error) {
	if f.Subject == "" {
		return s.Store.Parked(ctx, f) // the sweep at start finds nothing yet
	}
	if s.calls.Add(1) >= s.at {
		return nil, errCrashed
	}
	return s.Store.Parked(ctx, f)
}

// failingHold is a store that cannot record a hold.
type failingHold struct{ driver.Store }

var errHoldFailed = errors.New("hold failed")

func (failingHold) HoldDeadLetter(context.Context, driver.DeadLetter) error {
	return errHoldFailed
}

// failingDeadLetter is a store that cannot store the dead letter of the
// event id.
// hiddenParked is a store whose parked events its consumer's releaser
// never finds: the moment between an effect and the release it allows,
// held open.
type hiddenParked struct{ driver.Store }

func (hiddenParked) Parked(context.Context, driver.ParkedFilter) ([]driver.ParkedEvent, error) {
	return nil, nil
}

type failingDeadLetter struct {
	driver.Store
	id string
}

var errDeadLetterFailed = errors.New("dead letter failed")

func (s *failingDeadLetter) PublishDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	if dl.EventID == s.id {
		return errDeadLetterFailed
	}
	return s.Store.PublishDeadLetter(ctx, dl)
}

func (s *failingDeadLetter) HoldDeadLetter(ctx context.Context, dl driver.DeadLetter) error {
	if dl.EventID == s.id {
		return errDeadLetterFailed
	}
	return s.Store.HoldDeadLetter(ctx, dl)
}

// TestStrictOrderDiscardBeforeItsTurn: a poison event that overtook the
// one before it holds its subject; discarded with its parked events
// released (Store.Skip, dead-letters discard --release-parked) before
// that one arrived, it is skipped alone. The late event still takes
// effect, then the parked one. Before, the skip moved the checkpoint
// onto the discarded event, and the late one was skipped as stale.
func TestStrictOrderDiscardBeforeItsTurn(t *testing.T) {
	t.Parallel()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			o := newOrdered(t, b)
			h := o.handler(t, o.store)
			require.Equal(t, framework.Processed, deliver(t, h, "s3", "S", 3))
			poison := message.NewMessage(watermill.NewUUID(), []byte(`{"specversion":"1.0","id":"s5","source":"notes",`+
				`"type":"notes.note.added","subject":"S","data":{},"eventversion":1,"subjectseq":"5"}`))
			require.NoError(t, h(poison))
			require.Equal(t, framework.Parked, deliver(t, h, "s6", "S", 6))
			require.Equal(t, []string{"s5 held", "s6"}, o.parked(t))

			dls := o.deadLetters(t, "s5")
			require.Len(t, dls, 1)
			require.Equal(t, framework.CodeInvalidPayload, dls[0].Code)
			_, err := o.store.Skip(context.Background(), consumerName, "S", dls[0].Key())
			require.NoError(t, err)

			require.Equal(t, framework.Processed, deliver(t, h, "s4", "S", 4), "s4 arrives late: not stale")
			require.Equal(t, []string{"s3", "s4", "s6"}, o.applied(t, "s"), "s4's effect released s6")
			require.Empty(t, o.parked(t))
		})
	}
}
