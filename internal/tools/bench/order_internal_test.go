package bench

import (
	"encoding/json"
	"fmt"
	"strconv"
	"testing"
)

// TestOrderBacklog: the ordered backlog numbers each subject's events
// from 1 in the order published, subjects round robin, in the CloudEvent
// (subject, subjectseq as a string); a repeat comes after its event, byte
// for byte.
func TestOrderBacklog(t *testing.T) {
	msgs, distinct, keys := orderBacklog("t", 1000, 20, 0.02)
	if len(msgs) != 1000 || distinct != 980 || len(keys) != 980 {
		t.Fatalf("got %d messages of %d events (%d keys), want 1000 of 980", len(msgs), distinct, len(keys))
	}
	next := make(map[string]int)
	first := make(map[string]string)
	var order []string // subjects of the first 40 events
	for _, m := range msgs {
		var ev cloudEvent
		if err := json.Unmarshal(m.Body, &ev); err != nil {
			t.Fatal(err)
		}
		k := keys[m.ID]
		if ev.Subject != k.subject || ev.SubjectSeq != strconv.Itoa(k.seq) || ev.Data.AppointmentID != k.subject {
			t.Fatalf("%s: subject %q, subjectseq %q, appointment %q, want %+v", m.ID, ev.Subject, ev.SubjectSeq, ev.Data.AppointmentID, k)
		}
		if body, seen := first[m.ID]; seen {
			if body != string(m.Body) {
				t.Fatalf("repeat of %s differs from its first message", m.ID)
			}
			continue
		}
		first[m.ID] = string(m.Body)
		if want := next[k.subject] + 1; k.seq != want {
			t.Fatalf("%s: %s #%d published after #%d", m.ID, k.subject, k.seq, want-1)
		}
		next[k.subject] = k.seq
		if len(order) < 40 {
			order = append(order, k.subject)
		}
	}
	if len(next) != 20 || next["order-0"] != 49 || next["order-19"] != 49 {
		t.Fatalf("got %d subjects, order-0 up to #%d, order-19 up to #%d, want 20 up to #49", len(next), next["order-0"], next["order-19"])
	}
	for i, s := range order {
		if want := fmt.Sprintf("order-%d", i%20); s != want {
			t.Fatalf("event %d of subject %s, want %s (round robin)", i, s, want)
		}
	}
}

// TestOutOfOrder: a subject whose effects came out of subjectseq order is
// reported once, with its first effect out of place; others are not.
func TestOutOfOrder(t *testing.T) {
	keys := map[string]orderKey{
		"a1": {"a", 1}, "a2": {"a", 2}, "a3": {"a", 3},
		"b1": {"b", 1}, "b2": {"b", 2}, "b3": {"b", 3},
	}
	out, subjects := outOfOrder([]string{"a1", "b1", "b2", "foreign", "a2", "b3", "a3"}, keys)
	if len(out) != 0 || subjects != 2 {
		t.Fatalf("in order: got %q of %d subjects, want none of 2", out, subjects)
	}
	out, subjects = outOfOrder([]string{"a1", "b2", "a2", "b1", "a3", "b3"}, keys)
	if len(out) != 1 || out[0] != "b #1 after #2" || subjects != 2 {
		t.Fatalf("b out of order: got %q of %d subjects, want [b #1 after #2] of 2", out, subjects)
	}
	if out, _ = outOfOrder([]string{"a1", "a2", "a2", "a3"}, keys); len(out) != 1 {
		t.Fatalf("an effect twice: got %q, want it out of order", out)
	}
}
