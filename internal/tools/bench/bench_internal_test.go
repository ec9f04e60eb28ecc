package bench

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestBacklog: the backlog holds n messages, of which the share dup repeat
// an earlier event, byte for byte, after it.
func TestBacklog(t *testing.T) {
	msgs, distinct := Backlog("t", 1000, 0.02)
	if len(msgs) != 1000 || distinct != 980 {
		t.Fatalf("got %d messages of %d events, want 1000 of 980", len(msgs), distinct)
	}
	first := make(map[string]string)
	repeats := 0
	for _, m := range msgs {
		body, seen := first[m.ID]
		switch {
		case !seen:
			first[m.ID] = string(m.Body)
		case body != string(m.Body):
			t.Fatalf("repeat of %s differs from its first message", m.ID)
		default:
			repeats++
		}
	}
	if len(first) != distinct || repeats != 20 {
		t.Fatalf("got %d distinct ids and %d repeats, want %d and 20", len(first), repeats, distinct)
	}
}

// TestPercentile by nearest rank.
func TestPercentile(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 99: 99 * time.Millisecond, 100: 100 * time.Millisecond} {
		if got := Percentile(ds, p); got != want {
			t.Errorf("p%g = %s, want %s", p, got, want)
		}
	}
	if got := Percentile([]time.Duration{7}, 99); got != 7 {
		t.Errorf("p99 of one = %s, want 7ns", got)
	}
	ten := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if got := Percentile(ten, 51); got != 6 {
		t.Errorf("p51 of 1..10 = %d, want 6 (the 6th: 5.1 rounded up)", got)
	}
}

// TestMetricValue reads the unlabelled sample, not one whose name it
// prefixes.
func TestMetricValue(t *testing.T) {
	text := "# HELP go_memstats_mallocs_total x\n# TYPE go_memstats_mallocs_total counter\n" +
		"go_memstats_mallocs_total_other 1\ngo_memstats_mallocs_total 1.234567e+06\n"
	v, err := metricValue(strings.NewReader(text), "go_memstats_mallocs_total")
	if err != nil || v != 1234567 {
		t.Fatalf("got %v, %v; want 1234567", v, err)
	}
	if _, err := metricValue(strings.NewReader("other 1\n"), "go_memstats_mallocs_total"); err == nil {
		t.Fatal("no error for a missing sample")
	}
}

// TestMedian: a run measured in rounds is reported by its round with the
// median effects per second (the lower middle one of an even count), with
// every round's figure; a failed round is reported instead.
func TestMedian(t *testing.T) {
	round := func(effectsPerSecond int) RunReport {
		// Drained-1 effects in one second.
		return RunReport{Name: "r", Result: Result{Drained: effectsPerSecond + 1, Elapsed: time.Second}}
	}
	for _, tc := range []struct {
		rates []int
		want  float64
	}{
		{[]int{300, 100, 200}, 200},
		{[]int{400, 100, 300, 200}, 200},
		{[]int{100}, 100},
	} {
		rounds := make([]RunReport, len(tc.rates))
		for i, r := range tc.rates {
			rounds[i] = round(r)
		}
		got := median(rounds)
		if got.Result.EffectsPerSecond() != tc.want {
			t.Errorf("median of %v: got %v effects/s, want %v", tc.rates, got.Result.EffectsPerSecond(), tc.want)
		}
		if len(tc.rates) > 1 && len(got.Rounds) != len(tc.rates) || got.Rounds != nil && got.Rounds[0] != float64(tc.rates[0]) {
			t.Errorf("median of %v: rounds %v, want every round in order", tc.rates, got.Rounds)
		}
	}
	failed := round(50)
	failed.Err = errors.New("two effects of one event")
	if got := median([]RunReport{round(100), failed, round(300)}); got.Err == nil {
		t.Errorf("a failed round was not reported: got %+v", got)
	}
}

// requireMarkdownLines fails t unless r's Markdown holds each of lines.
func requireMarkdownLines(t *testing.T, r *Report, lines ...string) {
	t.Helper()
	var b strings.Builder
	if err := r.WriteMarkdown(&b); err != nil {
		t.Fatal(err)
	}
	for _, want := range lines {
		if !strings.Contains(b.String(), want) {
			t.Errorf("no line %q in:\n%s", want, b.String())
		}
	}
}
