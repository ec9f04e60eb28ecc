package transporttest

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// caseHold: a subscriber that is a driver.Holder, subscribed with a
// window of one message and up to two held out of it, hands out the next
// message each time its reader holds one, refuses a third hold, and
// frees no place when a held message settles: only the one in the window
// does. A transport that is no Holder is not held to it.
func caseHold(t *testing.T, s *suite) {
	name := s.consumer("hold")
	sub, err := s.env.Transport.Subscribe(driver.SubscribeConfig{
		Consumer: name, Types: []string{s.topic("a")}, Concurrency: 1, Settles: true, Hold: 2,
	})
	require.NoError(t, err)
	holder, ok := sub.Subscriber.(driver.Holder)
	if !ok {
		t.Skipf("%T is no driver.Holder", sub.Subscriber)
	}
	settler, ok := sub.Subscriber.(driver.Settler)
	require.True(t, ok, "a Holder settles what its reader reports (driver.Settler)")
	require.NoError(t, sub.Initialize())
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		_ = sub.Subscriber.Close()
	})
	msgs, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)
	want := s.publishN(t, s.topic("a"), "hold", 4)

	next := func(what string) *message.Message {
		t.Helper()
		select {
		case msg := <-msgs:
			return msg
		case <-time.After(s.env.Timeout):
			t.Fatalf("no message handed out: %s", what)
			return nil
		}
	}
	none := func(what string) {
		t.Helper()
		select {
		case msg := <-msgs:
			t.Fatalf("%s: message %s handed out", what, msg.Payload)
		case <-time.After(500 * time.Millisecond):
		}
	}
	done := func(msg *message.Message) {
		msg.Ack()
		settler.Settle(msg, true)
	}

	m1 := next("the first")
	none("a window of one")
	require.True(t, holder.Hold(m1))
	require.False(t, holder.Hold(m1), "held already")
	m2 := next("the second, once the first is held")
	require.True(t, holder.Hold(m2))
	m3 := next("the third, once the second is held")
	require.False(t, holder.Hold(m3), "two held at most")
	none("the window is the third's")
	done(m1)
	none("a held message's settling frees no place")
	done(m3)
	m4 := next("the fourth, once the third settled")
	require.True(t, holder.Hold(m4), "the first's hold ended with it")
	done(m2)
	done(m4)
	got := []string{string(m1.Payload), string(m2.Payload), string(m3.Payload), string(m4.Payload)}
	require.Equal(t, []string{want[0].payload, want[1].payload, want[2].payload, want[3].payload}, got, "in the order published")
}
