package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/printable"
)

// repartitionCommand returns the command that records a new partition
// count for a consumer that is drained and stopped.
func repartitionCommand(s Service) *cobra.Command {
	return &cobra.Command{
		Use:   "repartition CONSUMER N",
		Short: "Record N as a drained and stopped consumer's partition count",
		Long: `Repartition records N (1 to 64) as the number of partitions CONSUMER runs
with. A partitioned consumer keeps the count it first ran with, and the
service refuses to start it with another: a change moves subjects between
partitions, and while events of a subject wait in the old partition, its
new owner would handle later ones first.

It refuses while any process of the consumer is alive (its heartbeat, or a
lease of one of its partitions, has not expired: a process that died is
forgotten once its lease expires, 15 seconds by default), and while any
message waits in one of its partitions (as the consumers command counts
them). To change the count: stop the consumer's producers, let its
processes handle what waits until the consumers command shows nothing
waiting, stop them, run this command, set partitions: N in the service's
configuration, start the consumer's processes, then its producers.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 || n > driver.MaxPartitions {
				return fmt.Errorf("repartition: N: want a number of partitions from 1 to %d, got %q", driver.MaxPartitions, args[1])
			}
			db, closeDB, err := s.Open()
			if err != nil {
				return err
			}
			defer closeDB()
			return repartition(cmd.Context(), cmd.OutOrStdout(), db, args[0], n, time.Now)
		},
	}
}

// repartition records n as consumer's partition count, unless a process
// of it is alive or a message waits in one of its partitions, and says
// on out what to do next.
func repartition(ctx context.Context, out io.Writer, db Database, consumer string, n int, now func() time.Time) error {
	i := slices.IndexFunc(db.Declarations, func(d handlers.Declaration) bool { return d.Name == consumer })
	if i < 0 {
		declared := make([]string, 0, len(db.Declarations))
		for _, d := range db.Declarations {
			declared = append(declared, d.Name)
		}
		slices.Sort(declared)
		return fmt.Errorf("repartition: no consumer named %s is declared in this service (declared: %s)", printable.String(consumer), strings.Join(declared, ", "))
	}
	d := db.Declarations[i]
	leases, ok := db.Store.(driver.Leases)
	if !ok {
		return fmt.Errorf("repartition %s: the store %T keeps no partition counts (driver.Leases)", consumer, db.Store)
	}
	recorded, err := leases.RecordedPartitionCount(ctx, consumer)
	if err != nil {
		return fmt.Errorf("repartition %s: %w", consumer, err)
	}
	current := max(recorded, 1) // an unpartitioned consumer, or one that never ran
	if n == current {
		_, err := fmt.Fprintf(out, "consumer %s runs with %d partitions already: nothing to do\n", consumer, n)
		return err
	}
	if err := checkStopped(ctx, leases, consumer, now()); err != nil {
		return fmt.Errorf("repartition %s: %w", consumer, err)
	}
	if err := checkDrained(ctx, db, d, current); err != nil {
		return fmt.Errorf("repartition %s: %w", consumer, err)
	}
	if err := leases.SetPartitionCount(ctx, consumer, n); err != nil {
		return fmt.Errorf("repartition %s: %w", consumer, err)
	}
	configured := db.Config.Settings(consumer).Partitions
	next := fmt.Sprintf("set partitions: %d for it in the service's configuration (it says %d now), then start its processes", n, configured)
	if configured == n {
		next = "the service's configuration says so already: start its processes"
	}
	_, err = fmt.Fprintf(out, "consumer %s: %d partitions recorded (it ran with %d). Next: %s, then its producers.\n", consumer, n, current, next)
	return err
}

// checkStopped returns an error naming the live processes of consumer,
// and the partitions whose leases have not expired at now; nil when
// there are none.
func checkStopped(ctx context.Context, leases driver.Leases, consumer string, now time.Time) error {
	members, err := leases.Members(ctx, consumer)
	if err != nil {
		return err
	}
	all, err := leases.PartitionLeases(ctx, consumer)
	if err != nil {
		return err
	}
	var held []string
	var last time.Time
	for _, l := range all {
		if l.Owner != "" && !l.Expires.Before(now) {
			held = append(held, fmt.Sprintf("%d (%s)", l.Partition, printable.String(l.Owner)))
			if l.Expires.After(last) {
				last = l.Expires
			}
		}
	}
	switch {
	case len(members) > 0:
		return fmt.Errorf("refused: %d %s alive (%s): stop every one (one that died is forgotten once its heartbeat expires), then run this again",
			len(members), plural(len(members), "process of the consumer is", "processes of the consumer are"), printable.String(strings.Join(members, ", ")))
	case len(held) > 0:
		return fmt.Errorf("refused: partitions %s are leased until %s: stop every process of the consumer (a lease of one that died expires by itself), then run this again",
			strings.Join(held, ", "), last.UTC().Format(time.RFC3339))
	}
	return nil
}

// checkDrained returns an error naming the partitions of d, of n, where
// messages wait; nil when none does.
func checkDrained(ctx context.Context, db Database, d handlers.Declaration, n int) error {
	if db.Backlogs == nil {
		return fmt.Errorf("refused: the %s transport cannot count what waits for the consumer", db.Config.Transport)
	}
	counter, err := db.Backlogs(ctx)
	if err != nil {
		return fmt.Errorf("count what waits: %w", err)
	}
	if counter == nil {
		return fmt.Errorf("refused: the %s transport cannot count what waits for the consumer", db.Config.Transport)
	}
	backlogs, err := counter.Backlogs(ctx, d.Name, d.Types, n)
	if err != nil {
		return fmt.Errorf("count what waits: %w", err)
	}
	var waiting []string
	for _, b := range backlogs {
		if b.Waiting > 0 || b.More {
			waiting = append(waiting, fmt.Sprintf("%d (%s)", b.Partition, waitingText(partitionView{Waiting: &b.Waiting, WaitingMore: b.More})))
		}
	}
	if len(waiting) == 0 {
		return nil
	}
	return fmt.Errorf("refused: messages wait in partitions %s of %d: stop the consumer's producers, run its processes with %d partitions until the consumers command shows nothing waiting, stop them, then run this again",
		strings.Join(waiting, ", "), n, n)
}
