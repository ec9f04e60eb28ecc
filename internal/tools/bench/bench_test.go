package bench_test

import (
	"context"
	"os"
	"regexp"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/tools/bench"
)

// The test binary doubles as the harness's children (see bench.Child):
// started again with bench.EnvChild set, it runs the child instead of the
// tests.
func TestMain(m *testing.M) {
	if bench.IsChild() {
		os.Exit(bench.ChildMain(bench.Scenarios()))
	}
	goleak.VerifyTestMain(m)
}

// TestSmoke runs every scenario of make bench at 100 messages, 2% of them
// duplicates, without the latency phase or profiles, and fails when a
// consumer (the example service or a baseline) leaves other than one
// effect per distinct event: the harness cannot rot between two runs of
// make bench. It asserts no figure.
func TestSmoke(t *testing.T) {
	for _, s := range bench.Scenarios() {
		t.Run(s.Name, func(t *testing.T) {
			opts := bench.Options{
				Events:       100,
				StallTimeout: 30 * time.Second,
				Smoke:        true,
				Run:          regexp.MustCompile("^" + regexp.QuoteMeta(s.Name) + "$"),
				PostgresURL:  os.Getenv(testenv.PostgresURLVar),
				AMQPURL:      testenv.BenchAMQPURL(),
				Log:          testWriter{t},
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
			defer cancel()
			report, err := bench.Execute(ctx, []bench.Scenario{s}, opts)
			if err != nil {
				t.Fatal(err)
			}
			for _, sr := range report.Scenarios {
				if sr.Skipped != "" {
					testenv.Missing(t, "scenario %s: %s", sr.Name, sr.Skipped)
				}
			}
			if err := report.Err(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// testWriter logs the harness's progress lines through t.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}

// TestRunNames shows Options.RunNames selecting runs within a scenario:
// only the runs it matches are measured and reported, in each round.
func TestRunNames(t *testing.T) {
	measured := make(map[string]int)
	run := func(name string, baseline bool) bench.Run {
		return bench.Run{Name: name, Baseline: baseline, Measure: func(context.Context, *bench.Env) (bench.Result, error) {
			measured[name]++
			return bench.Result{Events: 1, Messages: 1, Effects: 1, DistinctEffects: 1}, nil
		}}
	}
	s := bench.Scenario{Name: "fake", Title: "Fake", Runs: []bench.Run{
		run("service, default", false), run("service, concurrency 1", false), run("raw limit", true),
	}}
	report, err := bench.Execute(context.Background(), []bench.Scenario{s}, bench.Options{
		Events: 2, Rounds: 2, StallTimeout: time.Second, Log: testWriter{t},
		RunNames: regexp.MustCompile("default|raw"),
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"service, default": 2, "raw limit": 2}
	if len(measured) != len(want) || measured["service, default"] != 2 || measured["raw limit"] != 2 {
		t.Fatalf("measured %v, want %v", measured, want)
	}
	var names []string
	for _, r := range report.Scenarios[0].Runs {
		names = append(names, r.Name)
	}
	if len(names) != 2 || names[0] != "service, default" || names[1] != "raw limit" {
		t.Fatalf("reported runs %q, want the two selected in their order", names)
	}
	if len(s.Runs) != 3 {
		t.Fatalf("the scenario's own runs changed: %d", len(s.Runs))
	}
}
