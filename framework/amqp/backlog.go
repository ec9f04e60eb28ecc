package amqp

import (
	"context"
	"errors"
	"fmt"

	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.BacklogCounter = (*Transport)(nil)

// Backlogs returns what waits for consumer in each of its partitions
// (driver.BacklogCounter): the messages ready in each partition's queue
// ("<consumer>.pNN"), or in the consumer's one queue when partitions is 1
// or less, as a passive declaration of the queue reports them; the
// messages delivered and not yet acknowledged are not counted, and
// RabbitMQ keeps no position. A queue that does not exist has nothing
// waiting. types are not needed: a queue holds every type of the
// consumer, and its replays.
//
// It costs a passive declaration per queue, on a channel of its own
// (opened again after a queue that does not exist, on which the broker
// closes it), and needs no management plugin. The transport must be
// connected (Connect).
func (t *Transport) Backlogs(ctx context.Context, consumer string, _ []string, partitions int) ([]driver.PartitionBacklog, error) {
	if consumer == "" {
		return nil, errors.New("amqp: backlogs: empty consumer name")
	}
	if partitions > driver.MaxPartitions {
		return nil, fmt.Errorf("amqp: backlogs of %s: partitions: at most %d, got %d", consumer, driver.MaxPartitions, partitions)
	}
	w, err := t.conn.wrapper()
	if err != nil {
		return nil, fmt.Errorf("amqp: backlogs of %s: %w", consumer, err)
	}
	conn := w.Connection()
	if conn == nil || !w.IsConnected() {
		return nil, fmt.Errorf("amqp: backlogs of %s: %w", consumer, ErrNotConnected)
	}
	n := max(partitions, 1)
	out := make([]driver.PartitionBacklog, n)
	var ch *amqp091.Channel
	defer func() {
		if ch != nil {
			_ = ch.Close()
		}
	}()
	for p := range out {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("amqp: backlogs of %s: %w", consumer, err)
		}
		queue := consumer
		if n > 1 {
			queue = partitionQueue(consumer, p)
		}
		if ch == nil {
			if ch, err = conn.Channel(); err != nil {
				return nil, fmt.Errorf("amqp: backlogs of %s: open channel: %w", consumer, err)
			}
		}
		q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
		switch {
		case isCode(err, amqp091.NotFound):
			ch = nil // the broker closed it
		case err != nil:
			return nil, fmt.Errorf("amqp: backlogs of %s: queue %s: %w", consumer, queue, err)
		}
		out[p] = driver.PartitionBacklog{Partition: p, Waiting: int64(min(q.Messages, driver.BacklogCap)), More: q.Messages > driver.BacklogCap}
	}
	return out, nil
}

var _ driver.InFlightAger = (*Transport)(nil)

// AgesInFlight returns true (driver.InFlightAger): a queue tells no
// message's age without the management plugin, so Backlogs leaves
// PartitionBacklog.OldestKnown false, and each process reports the age of
// the oldest message handed to its consumers and not yet finished, from
// its AMQP timestamp (framework.MetadataPublishedAt).
func (t *Transport) AgesInFlight() bool { return true }
