package runnertest

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	cloudevents "github.com/cloudevents/sdk-go/v2"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

func caseDeliverOnce(t *testing.T, s *suite) {
	s.start(t, s.consumer("once"), 1, s.typ)
	ids := s.publishN(t, s.typ, 20, 0)
	s.waitEffects(t, "once", len(ids))
	settle()
	s.requireExactlyOnce(t, "once", ids)
}

// caseConcurrentDuplicates: two processes of one consumer, each with
// concurrency 8, receive every event three times, published concurrently.
func caseConcurrentDuplicates(t *testing.T, s *suite) {
	name := s.consumer("dups")
	s.start(t, name, 8, s.typ)
	s.start(t, name, 8, s.typ)
	const n, copies = 40, 3
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "dup-" + string(rune('a'+i%26)) + randomHex(3)
	}
	var wg sync.WaitGroup
	for range copies {
		wg.Go(func() {
			for _, id := range ids {
				// Each copy is its own message, as a producer retrying a
				// publish would send it.
				if err := s.env.Transport.Publisher().Publish(s.typ.Type(), s.message(t, s.typ, "notes", id, "hello")); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	s.waitEffects(t, "dups", n)
	// Let every copy be handled (a duplicate is acknowledged and skipped).
	s.waitFor(t, "every copy handled", func() bool { return s.ackedOf(name) >= n*copies })
	settle()
	s.requireExactlyOnce(t, "dups", ids)
	require.Empty(t, s.deadLetters(t, name))
}

// caseRetry: the first two attempts of every event fail; the third
// commits, and only its effect remains.
func caseRetry(t *testing.T, s *suite) {
	s.setBehave(func(_ string, _ framework.Event[noteV1], call int) error {
		if call <= 2 {
			return errTransient
		}
		return nil
	})
	name := s.consumer("retry")
	s.start(t, name, 2, s.typ)
	ids := s.publishN(t, s.typ, 10, 0)
	s.waitEffects(t, "retry", len(ids))
	settle()
	s.requireExactlyOnce(t, "retry", ids)
	for _, id := range ids {
		require.Equal(t, 3, s.callsOf(name, "notes", id), "attempts of %s", id)
	}
	require.Empty(t, s.deadLetters(t, name))
}

// caseDeadLetters: a permanent failure and a poison message are stored as
// dead letters with their codes and acknowledged: they do not come back.
func caseDeadLetters(t *testing.T, s *suite) {
	s.setBehave(func(_ string, ev framework.Event[noteV1], _ int) error {
		if ev.Data.Text == "reject" {
			return framework.Permanent("note_rejected", nil)
		}
		return nil
	})
	name := s.consumer("dead")
	s.start(t, name, 2, s.typ)
	ids := s.publishN(t, s.typ, 5, 0)
	s.publish(t, s.typ,
		s.message(t, s.typ, "notes", "bad-1", "reject"),
		s.message(t, s.typ, "notes", "bad-2", "reject"),
		message.NewMessage(watermill.NewUUID(), []byte(`{"hello":"not a CloudEvent"}`)),
	)
	s.waitEffects(t, "dead", len(ids))
	s.waitFor(t, "3 dead letters", func() bool { return len(s.deadLetters(t, name)) == 3 })
	settle()
	codes := map[framework.Code]int{}
	for _, dl := range s.deadLetters(t, name) {
		codes[dl.Code]++
		require.Zero(t, dl.Repeats, "a dead-lettered message is acknowledged, not redelivered")
		require.Equal(t, driver.DeadLetterPending, dl.Status)
	}
	require.Equal(t, map[framework.Code]int{"note_rejected": 2, framework.CodeMalformedEnvelope: 1}, codes)
	s.requireExactlyOnce(t, "dead", ids)
	require.Equal(t, 1, s.callsOf(name, "notes", "bad-1"), "a permanent failure is not retried")
}

// caseReplay: a dead letter replayed to its consumer reaches it alone, not
// another consumer of the same type.
func caseReplay(t *testing.T, s *suite) {
	var mu sync.Mutex
	rejecting := true
	a, b := s.consumer("replay-a"), s.consumer("replay-b")
	s.setBehave(func(consumer string, _ framework.Event[noteV1], _ int) error {
		mu.Lock()
		defer mu.Unlock()
		if consumer == a && rejecting {
			return framework.Permanent("note_rejected", nil)
		}
		return nil
	})
	s.start(t, a, 1, s.typ)
	s.start(t, b, 1, s.typ)
	s.publish(t, s.typ, s.message(t, s.typ, "notes", "r-1", "hello"))
	s.waitFor(t, "the dead letter of "+a, func() bool { return len(s.deadLetters(t, a)) == 1 })
	s.waitEffects(t, "replay-b", 1)

	mu.Lock()
	rejecting = false
	mu.Unlock()
	dl := s.deadLetters(t, a)[0]
	require.NoError(t, s.env.Transport.Replay(context.Background(), a, dl.ReplayMessage()))
	s.waitEffects(t, "replay-a", 1)
	settle()
	s.requireExactlyOnce(t, "replay-a", []string{"r-1"})
	require.Equal(t, 1, s.callsOf(b, "notes", "r-1"), "the other consumer does not see the replay")
}

// caseRestart: a process stops in the middle of a stream; another one
// takes over and nothing is lost or applied twice.
func caseRestart(t *testing.T, s *suite) {
	s.slow = 10 * time.Millisecond
	name := s.consumer("restart")
	first := s.start(t, name, 2, s.typ)
	ids := s.publishN(t, s.typ, 60, 0)
	s.waitEffects(t, "restart", 10)
	first.stop()
	s.start(t, name, 2, s.typ)
	s.waitEffects(t, "restart", len(ids))
	settle()
	s.requireExactlyOnce(t, "restart", ids)
}

// caseSeveralTypes: one consumer handles two event types with one dedup
// key space.
func caseSeveralTypes(t *testing.T, s *suite) {
	s.start(t, s.consumer("multi"), 2, s.typ, s.typ2)
	ids := append(s.publishN(t, s.typ, 10, 0), s.publishN(t, s.typ2, 10, 100)...)
	s.waitEffects(t, "multi", len(ids))
	settle()
	s.requireExactlyOnce(t, "multi", ids)
}

// caseInterop: an event that a plain client built with the CloudEvents SDK
// and published without watermill is consumed, identified by its source
// and id; the same event published again is a duplicate.
func caseInterop(t *testing.T, s *suite) {
	require.NotNil(t, s.env.PublishRaw, "Env.PublishRaw is required: every transport takes events from plain clients")
	name := s.consumer("interop")
	s.start(t, name, 1, s.typ)
	ev := cloudevents.NewEvent()
	ev.SetID("interop-1")
	ev.SetSource("plain-client")
	ev.SetType(s.typ.Type())
	ev.SetExtension("eventversion", 1)
	require.NoError(t, ev.SetData(cloudevents.ApplicationJSON, noteV1{Text: "from a plain client"}))
	body, err := json.Marshal(ev)
	require.NoError(t, err)
	s.env.PublishRaw(t, s.typ.Type(), body)
	s.env.PublishRaw(t, s.typ.Type(), body)
	s.waitEffects(t, "interop", 1)
	s.waitFor(t, "both copies handled", func() bool { return s.ackedOf(name) >= 2 })
	settle()
	var got struct {
		Source  string `db:"source"`
		EventID string `db:"event_id"`
		Text    string `db:"text"`
	}
	require.NoError(t, s.env.DB.GetContext(context.Background(), &got,
		s.env.DB.Rebind(`SELECT source, event_id, text FROM effects WHERE consumer = ?`), name))
	require.Equal(t, "plain-client", got.Source)
	require.Equal(t, "interop-1", got.EventID)
	require.Equal(t, "from a plain client", got.Text)
	require.Empty(t, s.deadLetters(t, name))
}
