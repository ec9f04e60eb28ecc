// Command soak runs the soak of make soak (package internal/tools/soak): by
// default 20,000 events through the outbox and a three-node RabbitMQ
// cluster of its own with quorum queues, one node killed and brought
// back, the soak's own PostgreSQL restarted once, two consumer processes
// killed at random. It prints its progress and figures, and exits 1 when
// the figures are wrong.
//
//	go run ./internal/tools/soak/cmd/soak [-events 20000] [-rate 200] [-cluster=false -amqp URL]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/internal/tools/soak"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
}

func run() error {
	opts := soak.Options{Log: os.Stdout, KillEvery: [2]time.Duration{2 * time.Second, 5 * time.Second}}
	flag.IntVar(&opts.Events, "events", 20000, "events sent, duplicates included")
	flag.Float64Var(&opts.Rate, "rate", 200, "events per second the producer writes")
	flag.Uint64Var(&opts.Seed, "seed", uint64(time.Now().UnixNano()), "seed of the plan")
	flag.BoolVar(&opts.Cluster, "cluster", true, "a three-node RabbitMQ cluster of the soak's own, quorum queues, one node killed")
	flag.StringVar(&opts.AMQPURL, "amqp", os.Getenv("EFFECTIVELY_TEST_AMQP_URL"), "the RabbitMQ node to use with -cluster=false")
	flag.DurationVar(&opts.Settle, "settle", 5*time.Minute, "how long the consumers may take to finish after the producer")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Printf("soak: %d events, seed %d, rate %.0f/s, cluster %v\n", opts.Events, opts.Seed, opts.Rate, opts.Cluster)
	report, err := soak.Run(ctx, opts)
	if err != nil {
		return err
	}
	report.Print(os.Stdout)
	if err := report.Check(); err != nil {
		return fmt.Errorf("the figures are wrong:\n%w", err)
	}
	fmt.Println("soak: passed")
	return nil
}
