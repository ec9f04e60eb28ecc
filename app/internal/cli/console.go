package cli

import (
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
