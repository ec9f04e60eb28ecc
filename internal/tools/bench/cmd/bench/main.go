// Command bench runs the benchmark harness of package bench: every
// scenario, each side by side with its baseline, on the servers named by
// EFFECTIVELY_TEST_POSTGRES_URL and EFFECTIVELY_TEST_AMQP_URL (make bench
// starts them). It prints a table and writes docs/benchmarks.md.
//
//	go run ./internal/tools/bench/cmd/bench [-events 20000] [-run REGEXP] [-out docs/benchmarks.md]
//
// It exits non-zero, leaving the report file as it was, when a run fails,
// e.g. when a consumer left other than one effect per distinct event; and,
// after writing the report, when a gate is missed: a scenario's (the
// ratios, limits, start-up and latency bounds of gate.go) or, for a full
// run, the whole run's time (bench.MaxRunTime).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"strings"
	"syscall"

	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/tools/bench"
)

func main() {
	if bench.IsChild() {
		os.Exit(bench.ChildMain(bench.Scenarios()))
	}
	if err := run(); err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		os.Exit(1)
	}
}

func run() error {
	var (
		opts    bench.Options
		pattern string
		out     string
	)
	flag.IntVar(&opts.Events, "events", bench.DefaultEvents, fmt.Sprintf("messages per run, duplicates included (%d times as many in the sqlite scenario, %d in memory)", bench.SQLiteScale, bench.MemoryScale))
	flag.Float64Var(&opts.Duplicates, "duplicates", bench.DefaultDuplicates, "share of the messages that repeat an earlier event (negative: none)")
	flag.IntVar(&opts.Rounds, "rounds", bench.DefaultRounds, "how many times each run is measured (in rounds of every run of its scenario); the report shows the median")
	flag.DurationVar(&opts.LatencyDuration, "latency", bench.DefaultLatencyDuration, "how long the paced producer of the latency phase runs")
	flag.BoolVar(&opts.Smoke, "smoke", false, "check the effects only: no latency phase, no profiles, no docs written")
	flag.StringVar(&opts.Profiles, "profiles", "", "keep each run's CPU profiles in this folder (for go tool pprof)")
	flag.StringVar(&pattern, "run", "", "run only the scenarios whose name matches this regular expression; after a slash, only their runs whose name matches the part after it (sqlite/default|raw)")
	flag.StringVar(&out, "out", "docs/benchmarks.md", "where to write the report (empty: nowhere)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: bench [flags]\n\nScenarios:")
		for _, s := range bench.Scenarios() {
			fmt.Fprintf(flag.CommandLine.Output(), " %s", s.Name)
		}
		fmt.Fprintf(flag.CommandLine.Output(), "\nServers: EFFECTIVELY_TEST_POSTGRES_URL, EFFECTIVELY_TEST_AMQP_BENCH_URL or else EFFECTIVELY_TEST_AMQP_URL (make bench starts them).\n\nFlags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	scenarios, runs, _ := strings.Cut(pattern, "/")
	for _, p := range []struct {
		pattern string
		re      **regexp.Regexp
	}{{scenarios, &opts.Run}, {runs, &opts.RunNames}} {
		if p.pattern == "" {
			continue
		}
		re, err := regexp.Compile(p.pattern)
		if err != nil {
			return fmt.Errorf("-run: %w", err)
		}
		*p.re = re
	}
	opts.PostgresURL = os.Getenv("EFFECTIVELY_TEST_POSTGRES_URL")
	opts.AMQPURL = testenv.BenchAMQPURL()
	opts.Log = os.Stderr

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	report, err := bench.Execute(ctx, bench.Scenarios(), opts)
	if err != nil {
		return err
	}
	fmt.Println()
	if err := report.WriteTable(os.Stdout); err != nil {
		return err
	}
	if err := report.RunsErr(); err != nil {
		if out != "" && !opts.Smoke {
			fmt.Fprintf(os.Stderr, "%s not written: a run failed\n", out)
		}
		return errors.Join(err, report.GatesErr())
	}
	if out != "" && !opts.Smoke {
		f, err := os.Create(out)
		if err != nil {
			return fmt.Errorf("report: %w", err)
		}
		if err := report.WriteMarkdown(f); err != nil {
			_ = f.Close()
			return fmt.Errorf("report %s: %w", out, err)
		}
		if err := f.Close(); err != nil {
			return fmt.Errorf("report %s: %w", out, err)
		}
		fmt.Fprintf(os.Stderr, "wrote %s\n", out)
	}
	// A gate missed fails the run, after the report that shows it.
	return report.GatesErr()
}
