package bench_test

import (
	"context"
	"os"
	"regexp"
	"slices"
	"sync"
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
// duplicates, without the latency phase or profiles (nor the runs marked
// NoSmoke), and fails when a consumer (the example service or a baseline)
// leaves other than one effect per distinct event: the harness cannot rot
// between two runs of make bench. It asserts no figure. The example
// service is built once, for every scenario.
//
// The scenarios run in lanes at once, each lane one scenario after
// another. Those that need RabbitMQ (but the outbox's) share the example
// consumer's queue and the event type's exchange (see serviceQueue), so
// they take turns in a lane of each RabbitMQ virtual host: the
// benchmark's, and a second one when AMQPSmokeURLVar names it (make test
// does). The others each work in a PostgreSQL schema or a folder of their
// own, and share two lanes. A smoke run's figures say nothing, so the
// lanes may share the cores. Most of a scenario's time is waiting (a
// process starting, stopping, polling), so the lanes take about as long
// as the longest one.
func TestSmoke(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	service, err := bench.BuildService(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	type lane struct {
		amqpURL   string
		scenarios []bench.Scenario
	}
	benchURL := testenv.BenchAMQPURL()
	brokers := []*lane{{amqpURL: benchURL}}
	if u := os.Getenv(testenv.AMQPSmokeURLVar); u != "" {
		brokers = append(brokers, &lane{amqpURL: u})
	}
	others := []*lane{{amqpURL: benchURL}, {amqpURL: benchURL}}
	var nBroker, nOther int
	for _, s := range bench.Scenarios() {
		// The outbox scenario publishes to an exchange of each run's own.
		if slices.Contains(s.Needs, bench.NeedAMQP) && s.Name != "outbox" {
			l := brokers[nBroker%len(brokers)]
			l.scenarios = append(l.scenarios, s)
			nBroker++
			continue
		}
		l := others[nOther%len(others)]
		l.scenarios = append(l.scenarios, s)
		nOther++
	}
	var wg sync.WaitGroup
	for _, l := range append(brokers, others...) {
		wg.Go(func() {
			for _, s := range l.scenarios {
				t.Run(s.Name, func(t *testing.T) { smoke(t, service, l.amqpURL, s) })
			}
		})
	}
	wg.Wait()
}

// smoke runs scenario s, its example service the binary service and its
// broker at amqpURL, as TestSmoke does.
func smoke(t *testing.T, service, amqpURL string, s bench.Scenario) {
	opts := bench.Options{
		Events:        100,
		StallTimeout:  30 * time.Second,
		Smoke:         true,
		Run:           regexp.MustCompile("^" + regexp.QuoteMeta(s.Name) + "$"),
		PostgresURL:   os.Getenv(testenv.PostgresURLVar),
		AMQPURL:       amqpURL,
		ServiceBinary: service,
		Log:           testWriter{t},
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

// TestNoSmoke: a smoke run leaves out the runs marked NoSmoke, and a run
// that is no smoke run measures them.
func TestNoSmoke(t *testing.T) {
	for _, smoke := range []bool{true, false} {
		measured := make(map[string]int)
		run := func(name string, noSmoke bool) bench.Run {
			return bench.Run{Name: name, NoSmoke: noSmoke, Measure: func(context.Context, *bench.Env) (bench.Result, error) {
				measured[name]++
				return bench.Result{Events: 1, Messages: 1, Effects: 1, DistinctEffects: 1}, nil
			}}
		}
		s := bench.Scenario{Name: "fake", Title: "Fake", Runs: []bench.Run{run("unordered", true), run("strict", false)}}
		report, err := bench.Execute(context.Background(), []bench.Scenario{s}, bench.Options{
			Events: 2, Rounds: 1, Smoke: smoke, StallTimeout: time.Second, Log: testWriter{t},
		})
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]int{"unordered": 1, "strict": 1}
		if smoke {
			want = map[string]int{"strict": 1}
		}
		if len(measured) != len(want) || measured["strict"] != 1 || measured["unordered"] != want["unordered"] {
			t.Fatalf("smoke %v: measured %v, want %v", smoke, measured, want)
		}
		if got := len(report.Scenarios[0].Runs); got != len(want) {
			t.Fatalf("smoke %v: reported %d runs, want %d", smoke, got, len(want))
		}
	}
}
