package runnertest

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// caseOrderHotKeys: a strict_order consumer drains a few subjects of many
// events each, published in sequence, subjects interleaved: each event's
// handler finds its predecessor's effect, and no event waits by
// redelivery (no nack, no parked event, no dead letter).
func caseOrderHotKeys(t *testing.T, s *suite) {
	s.exerciseOrder(t, 8, 25)
}

// caseOrderColdKeys: as caseOrderHotKeys, with many subjects of few events.
func caseOrderColdKeys(t *testing.T, s *suite) {
	s.exerciseOrder(t, 100, 2)
}

// caseOrderHotKeysFailing: as caseOrderHotKeys, with the first attempt of
// every fifth event failing: the events of its subject behind it, which
// may have joined its batch already, wait for its retry in memory (no
// nack, park or dead letter), and run after it.
func caseOrderHotKeysFailing(t *testing.T, s *suite) {
	o := s.ordered(t)
	o.failFirst = func(seq int64) bool { return seq%5 == 0 }
	s.start(t, o.name, 16, s.typ)
	s.publishOrdered(t, 8, 25)
	o.check(t, 8*25)
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Equal(t, 8*5, o.failed, "first attempts failed on purpose")
}

// caseOrderHotSubject: a strict_order consumer of concurrency 4 takes a
// burst of ten events of one subject whose handler is slow (300 ms each,
// outside the database), then one event of each of six other subjects:
// those take effect while the hot subject's first events still run. Of a
// subject's events in the consumer one (a quarter of the window) holds a
// place of it; the others wait out of it (driver.Holder). Without that
// the hot subject's events filled the window, and the others came only
// once the seventh hot one had taken effect. (A first hot event, alone,
// shows the unit of work that its handlers wait outside the database, so
// that the attempts of the burst overlap instead of running one after
// another in a batch: that is the unit of work's to do, not the case's.)
func caseOrderHotSubject(t *testing.T, s *suite) {
	o := s.ordered(t)
	var (
		mu   sync.Mutex
		hot  int   // the hot subject's events handled so far
		cold []int // for each other subject's event handled, the hot ones handled before it
	)
	s.outside = func(ctx context.Context, ev framework.Event[noteV1]) error {
		if ev.Subject == "hot" {
			select {
			case <-time.After(300 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	}
	check := s.inOrder
	s.inOrder = func(ctx context.Context, ev framework.Event[noteV1]) error {
		if err := check(ctx, ev); err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		if ev.Subject == "hot" {
			hot++
		} else {
			cold = append(cold, hot)
		}
		return nil
	}
	s.start(t, o.name, 4, s.typ)
	var msgs []*message.Message
	add := func(subject string, seq int) {
		env, err := s.typ.Envelope(noteV1{Text: "step"}, framework.Attributes{
			ID: fmt.Sprintf("%s-%d", subject, seq), Source: "orders", Subject: subject, SubjectSeq: int64(seq),
		})
		require.NoError(t, err)
		msg, err := framework.NewMessage(env)
		require.NoError(t, err)
		msgs = append(msgs, msg)
	}
	add("hot", 1)
	s.publish(t, s.typ, msgs...)
	s.waitFor(t, "the first hot event", func() bool { return o.effects(t) == 1 })
	msgs = nil
	for seq := 2; seq <= 11; seq++ {
		add("hot", seq)
	}
	for i := range 6 {
		add(fmt.Sprintf("cold-%d", i), 1)
	}
	s.publish(t, s.typ, msgs...)
	o.check(t, 17)
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, cold, 6)
	for _, n := range cold {
		require.Less(t, n, 4, "the other subjects' events took effect before the fourth hot one (hot ones before each: %v)", cold)
	}
}

// exerciseOrder publishes perSubject events of each of subjects subjects
// (round robin, each subject's in sequence) to a strict_order consumer of
// concurrency 16 and checks the order of their effects.
func (s *suite) exerciseOrder(t *testing.T, subjects, perSubject int) {
	o := s.ordered(t)
	s.start(t, o.name, 16, s.typ)
	s.publishOrdered(t, subjects, perSubject)
	o.check(t, subjects*perSubject)
}

// orderCheck is what the order cases watch of a strict_order consumer.
type orderCheck struct {
	s          *suite
	name       string
	mu         sync.Mutex
	violations []string
	nacks      int
	// failFirst, when set, fails the first attempt of the events whose
	// subjectseq it holds; failed counts them.
	failFirst func(seq int64) bool
	failed    int
	tried     map[string]bool
}

// ordered makes the processes started after it run a strict_order
// consumer whose handler checks, in its transaction, that the event's
// predecessor of its subject took effect, and counts the nacks.
func (s *suite) ordered(t *testing.T) *orderCheck {
	t.Helper()
	ctx := context.Background()
	_, err := s.env.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS order_effects (consumer TEXT NOT NULL, subject TEXT NOT NULL, seq BIGINT NOT NULL, PRIMARY KEY (consumer, subject, seq))`)
	require.NoError(t, err)
	name := s.consumer("ordered")
	o := &orderCheck{s: s, name: name, tried: map[string]bool{}}
	s.inOrder = func(ctx context.Context, ev framework.Event[noteV1]) error {
		if o.failFirst != nil && o.failFirst(ev.SubjectSeq) {
			o.mu.Lock()
			first := !o.tried[ev.ID]
			o.tried[ev.ID] = true
			if first {
				o.failed++
			}
			o.mu.Unlock()
			if first {
				return fmt.Errorf("the first attempt of %s #%d fails on purpose", ev.Subject, ev.SubjectSeq)
			}
		}
		conn := framework.Conn(ctx, s.env.DB)
		var last int64
		if err := conn.QueryRowxContext(ctx, s.env.DB.Rebind(`SELECT COALESCE(MAX(seq), 0) FROM order_effects WHERE consumer = ? AND subject = ?`), name, ev.Subject).Scan(&last); err != nil {
			return fmt.Errorf("read the subject's last effect: %w", err)
		}
		if last != ev.SubjectSeq-1 {
			o.mu.Lock()
			o.violations = append(o.violations, fmt.Sprintf("%s #%d ran after #%d", ev.Subject, ev.SubjectSeq, last))
			o.mu.Unlock()
		}
		_, err := conn.ExecContext(ctx, s.env.DB.Rebind(`INSERT INTO order_effects (consumer, subject, seq) VALUES (?, ?, ?)`), name, ev.Subject, ev.SubjectSeq)
		return err
	}
	s.tune = func(cfg *runner.Config) {
		cfg.Consumers[0].StrictOrder = true
		cfg.Consumers[0].MaxDeliveries = 3 // a wait by redelivery would show
		cfg.Consumers[0].Partitions = s.partitions
		cfg.PartitionLease = 3 * time.Second
	}
	s.around = append(s.around, func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err != nil {
				o.mu.Lock()
				o.nacks++
				o.mu.Unlock()
			}
			return out, err
		}
	})
	return o
}

// publishOrdered publishes perSubject events of each of subjects
// subjects, round robin, each subject's numbered from 1.
func (s *suite) publishOrdered(t *testing.T, subjects, perSubject int) {
	t.Helper()
	msgs := make([]*message.Message, 0, subjects*perSubject)
	for seq := 1; seq <= perSubject; seq++ {
		for subject := range subjects {
			env, err := s.typ.Envelope(noteV1{Text: "step"}, framework.Attributes{
				ID: fmt.Sprintf("s%d-%d", subject, seq), Source: "orders",
				Subject: fmt.Sprintf("order-%d", subject), SubjectSeq: int64(seq),
			})
			require.NoError(t, err)
			msg, err := framework.NewMessage(env)
			require.NoError(t, err)
			msgs = append(msgs, msg)
		}
	}
	for start := 0; start < len(msgs); start += 50 {
		s.publish(t, s.typ, msgs[start:min(start+50, len(msgs))]...)
	}
}

// effects is how many events took effect.
func (o *orderCheck) effects(t *testing.T) int {
	return o.s.count(t, `SELECT count(*) FROM order_effects WHERE consumer = ?`, o.name)
}

// check waits for n effects and checks that each event ran after its
// predecessor's effect, once, with no nack, parked event or dead letter.
func (o *orderCheck) check(t *testing.T, n int) {
	t.Helper()
	o.s.waitFor(t, fmt.Sprintf("%d ordered effects", n), func() bool { return o.effects(t) >= n })
	require.Equal(t, n, o.effects(t), "effects")
	require.Equal(t, n, o.s.effects(t, o.name), "handlers' effects (once per event)")
	o.mu.Lock()
	defer o.mu.Unlock()
	require.Empty(t, o.violations, "events that ran before their predecessor took effect")
	require.Zero(t, o.nacks, "events nacked: waited by redelivery")
	require.Zero(t, o.s.count(t, `SELECT count(*) FROM parked_events WHERE consumer = ?`, o.name), "parked events")
	require.Empty(t, o.s.deadLetters(t, o.name), "dead letters")
}

// casePartitions: a strict_order consumer of 4 partitions drains hot keys
// on two processes, then one stops and a third starts mid-run: every
// event takes effect once, after its predecessor, with no dead letter,
// and the handover nacks nothing that counts (the nacks of a stop are
// not charged).
func casePartitions(t *testing.T, s *suite) {
	s.partitions = 4
	s.slow = 2 * time.Millisecond
	o := s.ordered(t)
	p1 := s.start(t, o.name, 8, s.typ)
	s.start(t, o.name, 8, s.typ)
	s.waitOwners(t, o.name, 2, 2)
	const subjects, perSubject = 20, 30
	s.publishOrdered(t, subjects, perSubject)
	s.waitFor(t, "a third of the effects", func() bool { return o.effects(t) >= subjects*perSubject/3 })
	p1.stopGracefully(t)
	s.waitOwners(t, o.name, 4)
	s.start(t, o.name, 8, s.typ)
	s.waitOwners(t, o.name, 2, 2)
	o.mu.Lock()
	o.nacks = 0 // the stop nacks what it could not finish; those are not charged
	o.mu.Unlock()
	o.check(t, subjects*perSubject) // the rebalance to the third nacks nothing
}

// waitOwners waits until the live owners of consumer's partitions hold
// so many partitions each (in any order).
func (s *suite) waitOwners(t *testing.T, consumer string, want ...int) {
	t.Helper()
	leases, ok := s.env.Store.(driver.Leases)
	require.True(t, ok, "%T keeps no leases", s.env.Store)
	slices.Sort(want)
	var got []int
	// Twice the suite's timeout: under the whole suite's load on two
	// cores the short test lease lapses now and then, and the shares
	// settle again a lease later.
	s.waitForWithin(t, 2*s.env.Timeout, fmt.Sprintf("owners holding %v partitions", want), func() bool {
		ls, err := leases.PartitionLeases(context.Background(), consumer)
		require.NoError(t, err)
		held := map[string]int{}
		for _, l := range ls {
			if l.Owner != "" && l.Expires.After(time.Now()) {
				held[l.Owner]++
			}
		}
		got = slices.Sorted(maps.Values(held))
		return slices.Equal(got, want)
	})
}
