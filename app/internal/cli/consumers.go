package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/printable"
)

// processedWindow is how far back the consumers view counts processed
// marks.
const processedWindow = time.Hour

// consumersCommand returns the operator's view of the declared consumers.
func consumersCommand(s Service) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "consumers",
		Short: "List the declared consumers with their settings and figures",
		Long: `Consumers lists every consumer the service declares: the event types it
receives, what the transport names its subscription (the RabbitMQ queue on
amqp, the consumer group on sqlite and postgres; the memory transport has
none), its concurrency and batch size from the configuration, whether it
deduplicates (and why not, when it does not), and from the database: the
events it processed in the last hour (processed marks; a consumer without
deduplication keeps none), its pending dead letters and the events parked
behind them (strict_order). Names that are not declared but still have
dead letters or parked events (a consumer renamed or removed) are listed
too. Then the outbox's unsent rows and the oldest of them. Last, for each
partitioned consumer (partitions above 1), its partitions: their count and
the consumer's live processes, then a row per partition with the process
that owns it (its lease; "—" when free or expired), the lease's fencing
token, how long the lease lasts unless renewed, the messages waiting in it
(counted by the transport, at most 100000: "100000+" past that; "?" when
the transport cannot tell) and, on PostgreSQL, its position in each topic
(the offset of the last message acknowledged in order; the consumer's
replay topic is "replay"). The WAITING and OLDEST columns are what waits
for each consumer, all its partitions together, as the transport counts
it: on sqlite and postgres the messages after the group's position and
the age of the oldest, by the database's clock; on amqp the messages
ready in its queues, and "?" for the age, which a queue does not tell
without the management plugin; "?" when the transport cannot count, and
a line after the table says why (a broker it could not reach within 5s,
say). With --json it prints the same as one JSON object.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return inspect(cmd.Context(), s, func(ctx context.Context, in inspection) error {
				rec, err := in.inspector.InspectConsumers(ctx, time.Now().Add(-processedWindow))
				if err != nil {
					return err
				}
				v := newConsumersView(in.cfg, in.declarations, rec)
				for i, d := range in.declarations {
					if v.Consumers[i].Partitions, err = in.partitions.partitions(ctx, d); err != nil {
						return err
					}
					v.Consumers[i].Lag = in.partitions.lag(ctx, d)
				}
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), v)
				}
				return printConsumers(cmd.OutOrStdout(), v)
			})
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(repartitionCommand(s), removeGroupCommand(s))
	return cmd
}

// consumersView is the answer of the consumers command.
type consumersView struct {
	Transport string         `json:"transport"`
	Consumers []consumerView `json:"consumers"`
	Outbox    outboxFigures  `json:"outbox"`
}

// consumerView is one consumer's row.
type consumerView struct {
	Name string `json:"name"`
	// Declared is false for a name the database holds dead letters or
	// parked events of that the service no longer declares.
	Declared bool     `json:"declared"`
	Types    []string `json:"types"`
	// Queue is the amqp queue ("<name>.p00..pNN", a queue per
	// partition, when partitioned); ConsumerGroup the sqlite or postgres
	// consumer group (on postgres, "<name>#<p>/<n>" per partition when
	// partitioned).
	Queue         string `json:"queue,omitempty"`
	ConsumerGroup string `json:"consumer_group,omitempty"`
	Concurrency   int    `json:"concurrency,omitempty"`
	BatchSize     int    `json:"batch_size,omitempty"`
	Dedup         bool   `json:"dedup"`
	// WithoutDedup is the reason it does not deduplicate.
	WithoutDedup       string `json:"without_dedup,omitempty"`
	ProcessedLastHour  int64  `json:"processed_last_hour"`
	PendingDeadLetters int64  `json:"pending_dead_letters"`
	Parked             int64  `json:"parked"`
	// Partitions are a partitioned consumer's; nil for another.
	Partitions *partitionsView `json:"partitions,omitempty"`
	// Lag is what waits for a declared consumer, as the transport counts
	// it; nil for a name not declared.
	Lag *lagView `json:"lag,omitempty"`
}

// outboxFigures are the outbox's unsent rows.
type outboxFigures struct {
	Unsent       int64      `json:"unsent"`
	OldestUnsent *time.Time `json:"oldest_unsent,omitempty"`
}

// newConsumersView returns the view of decls, with cfg's settings and
// rec's figures.
func newConsumersView(cfg Config, decls []handlers.Declaration, rec driver.ConsumersRecord) consumersView {
	v := consumersView{
		Transport: cfg.Transport,
		Consumers: []consumerView{},
		Outbox:    outboxFigures{Unsent: rec.Unsent, OldestUnsent: timeOrNil(rec.OldestUnsent)},
	}
	figures := make(map[string]driver.ConsumerFigures, len(rec.Consumers))
	for _, f := range rec.Consumers {
		figures[f.Consumer] = f
	}
	for _, d := range decls {
		s := cfg.Settings(d.Name)
		c := consumerView{
			Name: d.Name, Declared: true, Types: d.Types,
			Concurrency: s.Concurrency, BatchSize: s.BatchSize,
			Dedup: d.WithoutDedup == "", WithoutDedup: d.WithoutDedup,
		}
		switch cfg.Transport {
		case transportAMQP:
			c.Queue = d.Name
			if s.Partitions > 1 { // a queue per partition (framework/amqp)
				c.Queue = fmt.Sprintf("%s.p00..p%02d", d.Name, s.Partitions-1)
			}
		case transportSQLite, transportPostgres:
			c.ConsumerGroup = d.Name
		}
		f := figures[d.Name]
		delete(figures, d.Name)
		c.ProcessedLastHour, c.PendingDeadLetters, c.Parked = f.Processed, f.PendingDeadLetters, f.Parked
		v.Consumers = append(v.Consumers, c)
	}
	for _, f := range rec.Consumers {
		if _, left := figures[f.Consumer]; !left || f.PendingDeadLetters == 0 && f.Parked == 0 {
			continue // declared, or only marks of an old name: nothing to act on
		}
		v.Consumers = append(v.Consumers, consumerView{
			Name: f.Consumer, Types: []string{},
			ProcessedLastHour: f.Processed, PendingDeadLetters: f.PendingDeadLetters, Parked: f.Parked,
		})
	}
	return v
}

// printConsumers prints v as a table, then the outbox's line.
func printConsumers(out io.Writer, v consumersView) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tTYPES\tSUBSCRIPTION\tCONCURRENCY\tBATCH\tDEDUP\tPROCESSED 1H\tPENDING DL\tPARKED\tWAITING\tOLDEST")
	for _, c := range v.Consumers {
		sub, conc, batch, dedup := "-", "-", "-", "on"
		switch {
		case c.Queue != "":
			sub = v.Transport + " queue " + c.Queue
		case c.ConsumerGroup != "":
			sub = v.Transport + " group " + c.ConsumerGroup
		case c.Declared:
			sub = v.Transport
		}
		if c.Declared {
			conc, batch = fmt.Sprint(c.Concurrency), fmt.Sprint(c.BatchSize)
		}
		types := strings.Join(c.Types, ",")
		switch {
		case !c.Declared:
			types, dedup = "(not declared)", "-"
		case !c.Dedup:
			dedup = "off: " + c.WithoutDedup
		}
		processed := fmt.Sprint(c.ProcessedLastHour)
		if c.Declared && !c.Dedup {
			processed = "-" // it keeps no marks
		}
		waiting, oldest := "-", "-"
		if c.Declared {
			waiting, oldest = c.Lag.waitingCell(), c.Lag.oldestCell()
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\n", c.Name, types, sub, conc, batch, dedup,
			processed, c.PendingDeadLetters, c.Parked, waiting, oldest)
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, c := range v.Consumers {
		if c.Lag != nil && c.Lag.Error != "" {
			fmt.Fprintf(out, "%s: WAITING and OLDEST not counted: %s\n", c.Name, printable.String(c.Lag.Error))
		}
	}
	if v.Outbox.OldestUnsent == nil {
		fmt.Fprintln(out, "outbox: no unsent row")
	} else {
		fmt.Fprintf(out, "outbox: %d unsent, the oldest added %s (%s ago)\n", v.Outbox.Unsent,
			stamp(*v.Outbox.OldestUnsent), time.Since(*v.Outbox.OldestUnsent).Round(time.Second))
	}
	for _, c := range v.Consumers {
		if c.Partitions == nil {
			continue
		}
		if err := printPartitions(out, c.Name, *c.Partitions); err != nil {
			return err
		}
	}
	return nil
}
