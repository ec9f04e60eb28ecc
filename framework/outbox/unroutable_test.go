package outbox_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestRelayAMQPUnroutable: RabbitMQ drops a message published to an
// exchange with no queue bound. The relay publishes mandatory, so the
// broker returns it: the row stays unsent, counted by the gauge of its
// type, and is tried again at each poll until a queue is bound, then goes
// out, in order with the rows of its type behind it. Meanwhile the rows of
// other types flow, also when the waiting rows fill whole batches. A type
// declared droppable is marked sent and counted instead.
func TestRelayAMQPUnroutable(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			testRelayAMQPUnroutable(t, b, url)
		})
	}
}

func testRelayAMQPUnroutable(t *testing.T, b backend, url string) {
	bd := setup(t, b)
	id := suffix()
	lonelyType, otherType, dropType := "outbox.test.lonely."+id, "outbox.test.other."+id, "outbox.test.drop."+id
	lonely, other, drop := framework.Define[otherV1](lonelyType, 1), framework.Define[otherV1](otherType, 1), framework.Define[otherV1](dropType, 1)
	envelope := func(def framework.Definition[otherV1], id string) framework.Envelope { return typed(t, def, id) }
	tr := transport(t, url)
	br := dialBroker(t, url)
	otherQ := br.queue(t, otherType, false, nil)
	// The exchanges exist, with no queue bound (as once a type's last
	// consumer went, or before its first came).
	for _, typ := range []string{lonelyType, dropType} {
		require.NoError(t, br.ch.ExchangeDeclare(typ, "fanout", true, false, false, false, nil))
		t.Cleanup(func() {
			if ch, err := br.conn.Channel(); err == nil {
				_ = ch.ExchangeDelete(typ, false, false)
			}
		})
	}
	// Four waiting rows come first: two whole batches of them.
	bd.add(t, envelope(lonely, "l-0"), envelope(lonely, "l-1"), envelope(lonely, "l-2"), envelope(lonely, "l-3"),
		envelope(other, "o-0"), envelope(drop, "d-0"), envelope(other, "o-1"))

	reg := prometheus.NewRegistry()
	metrics, err := outbox.NewMetrics(reg)
	require.NoError(t, err)
	relay, err := outbox.NewRelay(bd.db, tr.Publisher(), outbox.RelayConfig{
		Outbox: bd.box, Metrics: metrics, BatchSize: 2, PollInterval: 20 * time.Millisecond,
		DropUnroutable: []string{dropType},
	})
	require.NoError(t, err)
	runRelay(t, relay)
	a := &arrivals{t: t, br: br}
	require.Eventually(t, a.arrived(otherQ, "o-0", "o-1"), waitLimit, 10*time.Millisecond, "the other type's rows flow")
	require.Eventually(t, func() bool {
		return value(t, reg, "effectively_outbox_unroutable_rows", lonelyType) == 4
	}, waitLimit, 10*time.Millisecond, "the gauge counts the waiting rows")
	// A row is marked sent, and counted, a moment after it arrived; the
	// gauge may come from a poll before.
	require.Eventually(t, func() bool {
		return value(t, reg, "effectively_outbox_published_total", "") == 2 &&
			slices.Equal(bd.unsentIDs(t), []string{"l-0", "l-1", "l-2", "l-3"})
	}, waitLimit, 10*time.Millisecond, "the other type's rows marked sent and counted, the droppable row marked sent, the others wait")
	require.Equal(t, float64(1), value(t, reg, "effectively_outbox_unroutable_dropped_total", dropType), "the droppable row is counted")

	// Polls go on trying; rows of other types added meanwhile flow.
	time.Sleep(100 * time.Millisecond)
	a.got = nil
	bd.add(t, envelope(other, "o-2"), envelope(lonely, "l-4"))
	require.Eventually(t, a.arrived(otherQ, "o-2"), waitLimit, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return value(t, reg, "effectively_outbox_unroutable_rows", lonelyType) == 5
	}, waitLimit, 10*time.Millisecond)
	require.Eventually(t, func() bool {
		return slices.Equal(bd.unsentIDs(t), []string{"l-0", "l-1", "l-2", "l-3", "l-4"})
	}, waitLimit, 10*time.Millisecond, "o-2 marked sent, the lonely rows wait")

	// A consumer comes: the waiting rows arrive, in order, and the gauge
	// goes back to 0.
	lonelyQ := br.queue(t, lonelyType, false, nil)
	a.got = nil
	require.Eventually(t, a.arrived(lonelyQ, "l-0", "l-1", "l-2", "l-3", "l-4"), waitLimit, 10*time.Millisecond)
	// The counter moves once the batch's record of being sent committed:
	// a moment after the rows read as sent.
	require.Eventually(t, func() bool {
		return len(bd.unsentIDs(t)) == 0 && value(t, reg, "effectively_outbox_unroutable_rows", lonelyType) == 0 &&
			value(t, reg, "effectively_outbox_published_total", "") == 8
	}, waitLimit, 10*time.Millisecond, "every row sent, the gauge at 0, 8 published")
}

// value returns the value of the metric name of reg, of the series whose
// type label is typ (any series when typ is empty); -1 when it has none.
func value(t *testing.T, reg *prometheus.Registry, name, typ string) float64 {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if typ != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool {
				return l.GetName() == "type" && l.GetValue() == typ
			}) {
				continue
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue()
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue()
			}
		}
	}
	return -1
}

// TestRelayAMQPRefusedTopic: a type whose exchange RabbitMQ refuses to
// declare (one of its name exists as another kind, declared by other
// tooling) holds up its own rows only: the rows of other types, before
// and after them, are published and marked sent on the same channel,
// and the refused rows go out, in order, once the exchange is fixed. The
// relay failed every poll on the first refused row and published no
// other row behind it.
func TestRelayAMQPRefusedTopic(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	bd := setup(t, backends[0])
	id := suffix()
	refusedType, otherType := "outbox.test.refused."+id, "outbox.test.fine."+id
	refused, other := framework.Define[otherV1](refusedType, 1), framework.Define[otherV1](otherType, 1)
	envelope := func(def framework.Definition[otherV1], id string) framework.Envelope { return typed(t, def, id) }
	br := dialBroker(t, url)
	otherQ := br.queue(t, otherType, false, nil)
	require.NoError(t, br.ch.ExchangeDeclare(refusedType, "topic", true, false, false, false, nil))
	bd.add(t, envelope(other, "o-0"), envelope(refused, "r-0"), envelope(other, "o-1"), envelope(refused, "r-1"), envelope(other, "o-2"))

	relay, err := outbox.NewRelay(bd.db, transport(t, url).Publisher(), outbox.RelayConfig{
		Outbox: bd.box, BatchSize: 10, PollInterval: 20 * time.Millisecond,
	})
	require.NoError(t, err)
	runRelay(t, relay)
	a := &arrivals{t: t, br: br}
	require.Eventually(t, a.arrived(otherQ, "o-0", "o-1", "o-2"), waitLimit, 10*time.Millisecond, "the other type's rows flow")
	require.Eventually(t, func() bool {
		return slices.Equal(bd.unsentIDs(t), []string{"r-0", "r-1"})
	}, waitLimit, 10*time.Millisecond, "the other rows marked sent, the refused ones wait")
	time.Sleep(100 * time.Millisecond) // polls go on
	a.got = nil
	bd.add(t, envelope(other, "o-3"))
	require.Eventually(t, a.arrived(otherQ, "o-3"), waitLimit, 10*time.Millisecond, "rows added meanwhile flow")

	// The exchange fixed, the refused rows go out in order.
	ch, err := br.conn.Channel()
	require.NoError(t, err)
	require.NoError(t, ch.ExchangeDelete(refusedType, false, false))
	a.got = nil
	refusedQ := br.queue(t, refusedType, false, nil)
	require.Eventually(t, a.arrived(refusedQ, "r-0", "r-1"), waitLimit, 10*time.Millisecond)
	require.Eventually(t, func() bool { return len(bd.unsentIDs(t)) == 0 }, waitLimit, 10*time.Millisecond)
}

// typed returns the event of def with id, from the source "notes".
func typed(t *testing.T, def framework.Definition[otherV1], id string) framework.Envelope {
	t.Helper()
	e, err := def.Envelope(otherV1{}, framework.Attributes{ID: id, Source: "notes"})
	require.NoError(t, err)
	return e
}

// runRelay runs relay until the test ends, and requires that it then
// stopped without an error.
func runRelay(t *testing.T, relay *outbox.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// arrivals gathers the ids of the messages delivered to the queues of
// br, since got was last emptied.
type arrivals struct {
	t   *testing.T
	br  *broker
	got []string
}

// arrived returns a condition: the ids gathered, with those waiting in
// queue q, are want.
func (a *arrivals) arrived(q string, want ...string) func() bool {
	return func() bool {
		a.got = append(a.got, deliveryIDs(a.br.drain(a.t, q))...)
		return fmt.Sprint(a.got) == fmt.Sprint(want)
	}
}
