package runnertest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
)

// caseBadInputs publishes every input of transporttest.Catalog the Env can carry,
// with a valid event before each and after the last, in one go: each
// input ends as a dead letter with its code (stored once, never
// redelivered) or takes effect, the valid events all take effect exactly
// once, and the consumer keeps running. A transport that keeps payloads
// and metadata as JSON (Env.StoresJSON) may refuse at publish what is not
// JSON text: no consumer ever sees it.
func caseBadInputs(t *testing.T, s *suite) {
	name := s.consumer("bad")
	p := s.start(t, name, 2, s.typ)
	inputs := transporttest.Catalog(s.typ.Type())
	var (
		effects []string                 // event ids that must take effect
		want    []transporttest.BadInput // inputs that must be dead letters
		bodies  = map[string]bool{}      // the catalog's bodies are distinct
		idle    []string                 // inputs the Env cannot carry
		refused = map[string]error{}     // inputs the transport refused
	)
	valid := func(i int) {
		id := fmt.Sprintf("valid-%d", i)
		s.publish(t, s.typ, s.message(t, s.typ, "notes", id, "hello"))
		effects = append(effects, id)
	}
	for i, in := range inputs {
		require.False(t, bodies[string(in.Body)], "input %s repeats a body", in.Name)
		bodies[string(in.Body)] = true
		valid(i)
		carried, err := s.env.Publish(t, s.typ.Type(), in)
		switch {
		case !carried:
			idle = append(idle, in.Name)
		case err != nil:
			refused[in.Name] = err
		case in.Code == "":
			effects = append(effects, in.ID)
		default:
			want = append(want, in)
		}
	}
	valid(len(inputs))
	t.Logf("%d inputs dead-lettered, %d take effect, %d refused at publish, %d the transport cannot carry (%s)",
		len(want), len(inputs)-len(want)-len(refused)-len(idle), len(refused), len(idle), strings.Join(idle, ", "))

	deadline := time.Now().Add(s.env.Timeout)
	// Every outcome counts: an input that took effect instead of being
	// dead-lettered ends the wait as well, and is reported below.
	for s.effects(t, name)+s.count(t, `SELECT count(*) FROM dead_letters WHERE consumer = ?`, name) < len(effects)+len(want) {
		if time.Now().After(deadline) {
			s.reportInputs(t, name, want, effects)
			t.Fatalf("timed out after %s waiting for %d effects and %d dead letters", s.env.Timeout, len(effects), len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	settle()
	s.reportInputs(t, name, want, effects)
	select {
	case <-p.runner.Stopped():
		t.Error("the consumer stopped")
	default:
	}
}

// reportInputs checks that each input of want is one dead letter of
// consumer with its code, that no other message was dead-lettered, and
// that exactly the events of effects took effect, once each: it reports
// every input that ended otherwise.
func (s *suite) reportInputs(t *testing.T, consumer string, want []transporttest.BadInput, effects []string) {
	t.Helper()
	dls, err := s.env.Store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumer, Limit: 10 * len(want)})
	require.NoError(t, err)
	byBody := make(map[string]driver.DeadLetter, len(dls))
	for _, dl := range dls {
		byBody[string(dl.Body)] = dl
	}
	for _, in := range want {
		dl, ok := byBody[string(in.Body)]
		delete(byBody, string(in.Body))
		switch {
		case !ok:
			t.Errorf("%s: no dead letter, want one with code %s", in.Name, in.Code)
		case dl.Code != in.Code:
			t.Errorf("%s: dead-lettered with code %s, want %s", in.Name, dl.Code, in.Code)
		case dl.Repeats != 0:
			t.Errorf("%s: dead-lettered, then delivered %d times more", in.Name, dl.Repeats)
		}
		for k, v := range in.Kept {
			if ok && dl.Metadata[k] != v {
				t.Errorf("%s: the dead letter's metadata %q is %q, want %q", in.Name, k, dl.Metadata[k], v)
			}
		}
	}
	for _, dl := range byBody {
		t.Errorf("unexpected dead letter %q with code %s of body %.100q", dl.Key(), dl.Code, dl.Body)
	}
	var got []struct {
		EventID string `db:"event_id"`
		N       int    `db:"n"`
	}
	require.NoError(t, s.env.DB.SelectContext(context.Background(), &got,
		s.env.DB.Rebind(`SELECT event_id, count(*) AS n FROM effects WHERE consumer = ? GROUP BY event_id`), consumer))
	counts := make(map[string]int, len(got))
	for _, g := range got {
		counts[g.EventID] = g.N
	}
	for _, id := range effects {
		if counts[id] != 1 {
			t.Errorf("event %s took effect %d times, want once", id, counts[id])
		}
		delete(counts, id)
	}
	for id, n := range counts {
		t.Errorf("event %.100q took effect %d times, want a dead letter", id, n)
	}
}
