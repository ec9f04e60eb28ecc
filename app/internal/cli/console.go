package cli

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// ConsoleConsumers returns the consumers of decls as the operator console
// shows them: as the consumers command lists them, without the figures.
func ConsoleConsumers(cfg Config, decls []handlers.Declaration) []console.Consumer {
	view := newConsumersView(cfg, decls, driver.ConsumersRecord{})
	consumers := make([]console.Consumer, 0, len(view.Consumers))
	for _, c := range view.Consumers {
		sub := ""
		switch {
		case c.Queue != "":
			sub = cfg.Transport + " queue " + c.Queue
		case c.ConsumerGroup != "":
			sub = cfg.Transport + " group " + c.ConsumerGroup
		}
		consumers = append(consumers, console.Consumer{
			Name: c.Name, Types: c.Types, Subscription: sub,
			Concurrency: c.Concurrency, BatchSize: c.BatchSize, WithoutDedup: c.WithoutDedup,
		})
	}
	return consumers
}

// RefuseReplay returns the replay command's refusals, for the operator
// console's replay button: a consumer not declared in decls, a dead
// letter that first failed longer ago than processed_retention (the
// command's --force has no button). It says why the dead letter cannot
// be replayed at now, or returns "" when it can.
func RefuseReplay(cfg Config, decls []handlers.Declaration) func(dl driver.DeadLetter, now time.Time) string {
	op := newOperator(Database{Config: cfg, Declarations: decls})
	return func(dl driver.DeadLetter, now time.Time) string { return op.refuseReplay(dl, false, now) }
}

// consoleSource returns the partition source of the console's views on
// db, whose backlogs counter counts (none when nil), and decls by name.
func consoleSource(db Database, counter driver.BacklogCounter, decls []handlers.Declaration) (partitionSource, map[string]handlers.Declaration) {
	if counter != nil {
		db.Backlogs = func(context.Context) (driver.BacklogCounter, error) { return counter, nil }
	}
	byName := make(map[string]handlers.Declaration, len(decls))
	for _, d := range decls {
		byName[d.Name] = d
	}
	return newPartitionSource(db), byName
}

// ConsolePartitions returns the partitions of the consumers of decls as
// the operator console shows them (console.Config.Partitions): as the
// consumers command lists them, their leases read from store and what
// waits in them counted by counter (nil when the transport counts none).
func ConsolePartitions(cfg Config, store driver.Store, counter driver.BacklogCounter, decls []handlers.Declaration) func(ctx context.Context, consumer string) (*console.Partitions, error) {
	src, byName := consoleSource(Database{Config: cfg, Store: store}, counter, decls)
	return func(ctx context.Context, consumer string) (*console.Partitions, error) {
		d, ok := byName[consumer]
		if !ok {
			return nil, nil
		}
		v, err := src.partitions(ctx, d)
		if err != nil || v == nil {
			return nil, err
		}
		out := &console.Partitions{Count: v.Count, Configured: v.Configured, Members: v.Members, BacklogError: v.BacklogError}
		for _, p := range v.Partitions {
			row := console.Partition{Partition: p.Partition, Owner: p.Owner, Token: p.Token, Waiting: waitingText(p), Position: positionsText(consumer, p.Positions)}
			if p.LeaseExpiresIn != nil {
				row.ExpiresIn = time.Duration(*p.LeaseExpiresIn * float64(time.Second)).Round(time.Second)
			}
			out.Rows = append(out.Rows, row)
		}
		return out, nil
	}
}
