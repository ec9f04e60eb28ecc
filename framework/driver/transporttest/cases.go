package transporttest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// caseDeliver: a subscription of two types receives every message
// published to either, with its payload and metadata intact.
func caseDeliver(t *testing.T, s *suite) {
	name := s.consumer("deliver")
	s.start(t, name, 2, nil, s.topic("a"), s.topic("b"))
	want := append(s.publishN(t, s.topic("a"), "deliver-a", 20), s.publishN(t, s.topic("b"), "deliver-b", 20)...)
	s.waitAcked(t, name, want)
	settle()
	s.requireIntact(t, name, want)
}

// caseNackRedelivers: a nacked message is delivered again, intact, until
// it is acked.
func caseNackRedelivers(t *testing.T, s *suite) {
	s.setBehave(func(d delivery) error {
		if d.call == 1 {
			return errNack
		}
		return nil
	})
	name := s.consumer("nack")
	s.start(t, name, 2, nil, s.topic("a"))
	want := s.publishN(t, s.topic("a"), "nack", 10)
	s.waitAcked(t, name, want)
	settle()
	s.requireIntact(t, name, want)
	for _, m := range want {
		require.GreaterOrEqualf(t, len(s.deliveriesOf(name, m.payload)), 2, "deliveries of %s", m.payload)
	}
}

// caseInitializeKeeps: messages published after Subscription.Initialize
// and before the subscriber's first Subscribe reach it.
func caseInitializeKeeps(t *testing.T, s *suite) {
	name := s.consumer("init")
	var want []sent
	s.start(t, name, 1, func() { want = s.publishN(t, s.topic("a"), "init", 10) }, s.topic("a"))
	s.waitAcked(t, name, want)
	settle()
	s.requireIntact(t, name, want)
}

// caseReplay: a message replayed to one consumer reaches it, intact, and
// not another consumer of the same type, which received the published
// message as well.
func caseReplay(t *testing.T, s *suite) {
	a, b := s.consumer("replay-a"), s.consumer("replay-b")
	s.start(t, a, 1, nil, s.topic("a"))
	s.start(t, b, 1, nil, s.topic("a"))
	published := s.publishN(t, s.topic("a"), "replay-published", 1)
	s.waitAcked(t, a, published)
	s.waitAcked(t, b, published)

	replayed := sent{payload: `{"replayed":"` + s.id + `"}`, metadata: map[string]string{"tt-replayed": "yes"}}
	require.NoError(t, s.env.Transport.Replay(context.Background(), a, newMessage(replayed)))
	s.waitAcked(t, a, []sent{replayed})
	settle()
	s.requireIntact(t, a, append(published, replayed))
	s.requireIntact(t, b, published)
}

// caseReady: a transport built (and connected) by its package can
// deliver.
func caseReady(t *testing.T, s *suite) {
	require.True(t, s.env.Transport.Ready(), "Ready")
}

// caseClose: Close closes what the transport built: the subscriber's
// channels end and the publisher refuses to publish.
func caseClose(t *testing.T, s *suite) {
	name := s.consumer("close")
	topic := s.topic("a")
	sub := s.subscribe(t, name, topic)
	ch, err := sub.Subscriber.Subscribe(context.Background(), sub.Topics[0])
	require.NoError(t, err)
	want := s.publishN(t, topic, "close", 1)
	select {
	case msg := <-ch:
		require.Equal(t, want[0].payload, string(msg.Payload))
		msg.Ack()
	case <-time.After(s.env.Timeout):
		t.Fatal("no message before Close")
	}

	require.NoError(t, s.env.Transport.Close())
	deadline := time.After(s.env.Timeout)
	for open := true; open; {
		select {
		case msg, ok := <-ch:
			if ok {
				msg.Nack()
			}
			open = ok
		case <-deadline:
			t.Fatal("the subscriber's channel is still open after Close")
		}
	}
	require.Error(t, s.env.Transport.Publisher().Publish(topic, newMessage(sent{payload: `{"after":"close"}`})),
		"publish after Close")
}

// casePlainClient: a body that a plain client published without
// watermill (Env.PublishRaw) reaches the subscriber intact.
func casePlainClient(t *testing.T, s *suite) {
	require.NotNil(t, s.env.PublishRaw, "Env.PublishRaw is required: every transport takes messages from plain clients")
	name := s.consumer("plain")
	s.start(t, name, 1, nil, s.topic("a"))
	want := []sent{{payload: `{"from":"a plain client","case":"` + s.id + `"}`}}
	s.env.PublishRaw(t, s.topic("a"), []byte(want[0].payload))
	s.waitAcked(t, name, want)
	settle()
	s.requireIntact(t, name, want)
}
