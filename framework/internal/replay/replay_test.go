package replay_test

import (
	"context"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework/internal/replay"
)

type ctxKey struct{}

func TestPublishCopiesEachMessageWithTheCallersContext(t *testing.T) {
	ctx := context.WithValue(context.Background(), ctxKey{}, "caller")
	msgs := []*message.Message{message.NewMessage("a", []byte("1")), message.NewMessage("b", []byte("2"))}
	var got []*message.Message
	err := replay.Publish(ctx, func(m *message.Message) error {
		got = append(got, m)
		return nil
	}, msgs...)
	if err != nil {
		t.Fatalf("Publish: %v", err)
	}
	if len(got) != len(msgs) {
		t.Fatalf("published %d messages, want %d", len(got), len(msgs))
	}
	for i, m := range got {
		if m == msgs[i] {
			t.Errorf("message %d: published the caller's message, want a copy", i)
		}
		if m.UUID != msgs[i].UUID || string(m.Payload) != string(msgs[i].Payload) {
			t.Errorf("message %d: published %s %q, want %s %q", i, m.UUID, m.Payload, msgs[i].UUID, msgs[i].Payload)
		}
		if v := m.Context().Value(ctxKey{}); v != "caller" {
			t.Errorf("message %d: context value %v, want the caller's", i, v)
		}
		if v := msgs[i].Context().Value(ctxKey{}); v != nil {
			t.Errorf("message %d: the caller's message got context value %v", i, v)
		}
	}
}

func TestPublishStopsAtTheFirstError(t *testing.T) {
	boom := errors.New("boom")
	msgs := []*message.Message{message.NewMessage("a", nil), message.NewMessage("b", nil)}
	calls := 0
	err := replay.Publish(context.Background(), func(*message.Message) error {
		calls++
		return boom
	}, msgs...)
	if !errors.Is(err, boom) {
		t.Fatalf("Publish returned %v, want %v", err, boom)
	}
	if calls != 1 {
		t.Fatalf("publish called %d times, want 1", calls)
	}
}
