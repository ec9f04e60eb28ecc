package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/printable"
)

// noOwner is what the partitions table shows for the owner, and the
// lease's expiry, of a partition that no live process holds.
const noOwner = "—"

// partitionsView is a partitioned consumer's partitions, as the consumers
// command and the console show them.
type partitionsView struct {
	// Count is the number of partitions the consumer runs with, as
	// recorded at its first partitioned start (see the repartition
	// command); the configured one until then.
	Count int `json:"count"`
	// Configured is the partitions setting; the service refuses to start
	// while it differs from Count.
	Configured int `json:"configured"`
	// Members are the consumer's live processes.
	Members []string `json:"members"`
	// Partitions are the partitions, 0 to Count-1.
	Partitions []partitionView `json:"partitions"`
	// BacklogError says why the waiting messages are not known; empty
	// when they are.
	BacklogError string `json:"backlog_error,omitempty"`
}

// partitionView is one partition: its lease and what waits in it.
type partitionView struct {
	Partition int `json:"partition"`
	// Owner is the live process holding the partition's lease; empty
	// when free or expired.
	Owner string `json:"owner,omitempty"`
	// Token is the lease's fencing token; 0 when the partition never had
	// an owner.
	Token int64 `json:"token"`
	// LeaseExpires is when the owner's lease ends unless renewed, by the
	// database's clock; nil when there is no owner.
	LeaseExpires *time.Time `json:"lease_expires,omitempty"`
	// LeaseExpiresIn is LeaseExpires from now, in seconds.
	LeaseExpiresIn *float64 `json:"lease_expires_in_seconds,omitempty"`
	// Waiting is how many messages wait in the partition (see
	// driver.PartitionBacklog); nil when the transport cannot tell.
	Waiting *int64 `json:"waiting,omitempty"`
	// WaitingMore says the count stopped at driver.BacklogCap.
	WaitingMore bool `json:"waiting_more,omitempty"`
	// Positions are the partition's positions by topic (PostgreSQL).
	Positions []positionView `json:"positions,omitempty"`
}

// positionView is a partition's position in a topic.
type positionView struct {
	Topic string `json:"topic"`
	// Offset is the last message acknowledged in order; nil when the
	// topic holds no position of the partition yet.
	Offset  *int64 `json:"offset"`
	Waiting int64  `json:"waiting"`
}

// partitionSource reads the partitions of the consumers: their leases
// from the store, what waits from the transport.
type partitionSource struct {
	cfg    Config
	leases driver.Leases // nil when the store keeps none
	// backlogs opens the transport's counter; nil when there is none.
	backlogs func(ctx context.Context) (driver.BacklogCounter, error)
	now      func() time.Time
}

// partitions returns the partitions of the consumer d: nil when it is not
// partitioned (neither configured nor recorded with more than one). A
// backlog the transport fails to count is said in BacklogError; a store
// that fails is an error.
func (src partitionSource) partitions(ctx context.Context, d handlers.Declaration) (*partitionsView, error) {
	configured := src.cfg.Settings(d.Name).Partitions
	if src.leases == nil {
		if configured > 1 {
			return nil, fmt.Errorf("consumer %s: partitions: %d, but the store keeps no partition leases", d.Name, configured)
		}
		return nil, nil
	}
	recorded, err := src.leases.RecordedPartitionCount(ctx, d.Name)
	if err != nil {
		return nil, err
	}
	if configured <= 1 && recorded <= 1 {
		return nil, nil
	}
	v := &partitionsView{Count: recorded, Configured: configured}
	if v.Count == 0 {
		v.Count = configured
	}
	if v.Members, err = src.leases.Members(ctx, d.Name); err != nil {
		return nil, err
	}
	v.Members = append([]string{}, v.Members...)
	leases, err := src.leases.PartitionLeases(ctx, d.Name)
	if err != nil {
		return nil, err
	}
	now := src.now()
	v.Partitions = make([]partitionView, v.Count)
	for p := range v.Partitions {
		v.Partitions[p].Partition = p
	}
	for _, l := range leases {
		if l.Partition < 0 || l.Partition >= v.Count {
			continue // of an earlier count
		}
		pv := &v.Partitions[l.Partition]
		pv.Token = l.Token
		if l.Owner != "" && !l.Expires.Before(now) {
			expires, in := l.Expires.UTC(), l.Expires.Sub(now).Seconds()
			pv.Owner, pv.LeaseExpires, pv.LeaseExpiresIn = l.Owner, &expires, &in
		}
	}
	backlogs, err := src.backlog(ctx, d, v.Count)
	if err != nil {
		v.BacklogError = err.Error()
		return v, nil
	}
	for _, b := range backlogs {
		if b.Partition < 0 || b.Partition >= v.Count {
			continue
		}
		pv := &v.Partitions[b.Partition]
		waiting := b.Waiting
		pv.Waiting, pv.WaitingMore = &waiting, b.More
		for _, tb := range b.Topics {
			pos := positionView{Topic: tb.Topic, Waiting: tb.Waiting}
			if tb.Known {
				offset := tb.Position
				pos.Offset = &offset
			}
			pv.Positions = append(pv.Positions, pos)
		}
	}
	return v, nil
}

// backlog counts what waits in each of the n partitions of d.
func (src partitionSource) backlog(ctx context.Context, d handlers.Declaration, n int) ([]driver.PartitionBacklog, error) {
	if src.backlogs == nil {
		return nil, fmt.Errorf("the %s transport cannot count what waits in a partition", src.cfg.Transport)
	}
	counter, err := src.backlogs(ctx)
	if err != nil {
		return nil, err
	}
	if counter == nil {
		return nil, fmt.Errorf("the %s transport cannot count what waits in a partition", src.cfg.Transport)
	}
	return counter.Backlogs(ctx, d.Name, d.Types, n)
}

// printPartitions prints the partitions of consumer: a line that says
// their count and live processes, then a table of them.
func printPartitions(out io.Writer, consumer string, v partitionsView) error {
	count := fmt.Sprintf("%d partitions", v.Count)
	switch {
	case v.Configured == v.Count:
	case v.Configured > 1:
		count += fmt.Sprintf(" (configured: %d; the service refuses to start until the consumers repartition %s %d command)", v.Configured, consumer, v.Configured)
	default:
		count += fmt.Sprintf(" (configured: unpartitioned, as the service runs it; the consumers repartition %s 1 command records it)", consumer)
	}
	members := "no live process"
	if len(v.Members) > 0 {
		members = fmt.Sprintf("%d live %s: %s", len(v.Members), plural(len(v.Members), "process", "processes"), strings.Join(v.Members, ", "))
	}
	fmt.Fprintf(out, "\nconsumer %s: %s, %s\n", consumer, count, members)
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "PARTITION\tOWNER\tTOKEN\tLEASE EXPIRES IN\tWAITING\tPOSITION")
	for _, p := range v.Partitions {
		owner, expires := noOwner, noOwner
		if p.Owner != "" {
			owner, expires = printable.String(p.Owner), time.Duration(*p.LeaseExpiresIn*float64(time.Second)).Round(time.Second).String()
		}
		fmt.Fprintf(w, "%d\t%s\t%d\t%s\t%s\t%s\n", p.Partition, owner, p.Token, expires, waitingText(p), positionsText(consumer, p.Positions))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	if v.BacklogError != "" {
		_, err := fmt.Fprintf(out, "waiting messages unknown: %s\n", printable.String(v.BacklogError))
		return err
	}
	return nil
}

// waitingText is the WAITING cell of p: its count, "N+" when it stopped
// at the cap, "?" when unknown.
func waitingText(p partitionView) string {
	switch {
	case p.Waiting == nil:
		return "?"
	case p.WaitingMore:
		return fmt.Sprintf("%d+", *p.Waiting)
	}
	return fmt.Sprint(*p.Waiting)
}

// positionsText is the POSITION cell: each topic's offset ("-" before
// the first), the consumer's replay topic named "replay"; "-" when the
// transport keeps no position.
func positionsText(consumer string, positions []positionView) string {
	if len(positions) == 0 {
		return "-"
	}
	parts := make([]string, 0, len(positions))
	for _, pos := range positions {
		topic := pos.Topic
		if topic == pipeline.ReplayTopic(consumer) {
			topic = "replay"
		}
		offset := "-"
		if pos.Offset != nil {
			offset = fmt.Sprint(*pos.Offset)
		}
		parts = append(parts, printable.String(topic)+"@"+offset)
	}
	return strings.Join(parts, " ")
}

// plural returns one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
