package amqp

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// PartitionHeader is the header that RabbitMQ's consistent-hash exchange
// of a partitioned consumer hashes to pick the partition of a message: an
// AMQP long string holding driver.PartitionKey of the CloudEvent in the
// message, its subject, or its id when it has none. The framework's
// publishers set it on every message whose payload is a CloudEvent, its
// Replay too; another program that publishes events sets it the same way,
// as a string (a byte array of the same text hashes elsewhere). A message
// without it goes to one partition, always the same for a given number of
// partitions: it is not lost, but its events are not spread.
const PartitionHeader = "effectively-partition-key"

// ErrNoConsistentHash is returned when the broker lacks the
// consistent-hash exchange type that partitioned consumers need.
var ErrNoConsistentHash = errors.New("amqp: the broker has no x-consistent-hash exchange type, which partitioned consumers need " +
	"(enable its plugin on every node: rabbitmq-plugins enable rabbitmq_consistent_hash_exchange)")

// The topology of a partitioned consumer.
const (
	// kindConsistentHash is the exchange type of the consistent-hash
	// exchange plugin (rabbitmq_consistent_hash_exchange).
	kindConsistentHash = "x-consistent-hash"
	// partitionWeight is the binding key of every partition's queue:
	// its weight on the hash ring, one bucket each.
	partitionWeight = "1"
	// exchangeSuffix names a consumer's consistent-hash exchange.
	exchangeSuffix = ".partitions"
	// maxName is the longest exchange or queue name AMQP carries.
	maxName = 255
)

// A partition's queue is named with two digits, so that the names sort as
// the partitions do. It fails to compile if MaxPartitions outgrows them.
var _ [100 - driver.MaxPartitions]struct{}

// partitions is the topology and the consumption of a partitioned
// consumer (driver.SubscribeConfig.Partitions above 1).
//
// The consumer has a consistent-hash exchange of its own, named
// "<consumer>.partitions", of type x-consistent-hash, hashing
// PartitionHeader, bound to the fanout exchange of each of its event
// types as an unpartitioned consumer's queue is. Each partition i has a
// durable queue named "<consumer>.pNN" (NN the partition, two digits: the
// name does not hold the number of partitions, so that the queues stay
// when it changes), of the transport's queue type, with
// x-single-active-consumer, bound to the exchange with weight 1. The
// plugin puts each queue's bucket on its ring in the order the bindings
// were made: the partitions' order, each process binding them in turn.
//
// Which partition a key goes to is the plugin's: a jump consistent hash of
// the header's value over the ring's buckets, not driver.PartitionOf. It
// stays while the broker runs, and more partitions move about (M-N)/M of
// the keys. But RabbitMQ 3.10 rebuilds the ring when a node restarts, in
// the order it recovers the queues, not the order they were bound in, and
// that order varies from one restart to the next (seen for 4 partitions:
// [p00 p01 p02 p03] came back as [p00 p02 p03 p01]): after a restart
// some keys go to other partitions than before.
//
// Single active consumer is the broker's guard only: RabbitMQ hands each
// queue to its first consumer, so a process consumes only the partitions
// it is assigned (Assign).
type partitions struct {
	conn     *connection
	consumer string
	exchange string
	n        int
	args     amqp091.Table // of each partition's queue

	initMu   sync.Mutex // one declaration at a time
	declared bool       // the partitions' queues and bindings

	// The consumption (see partitionedSubscriber).
	out      chan *message.Message
	slots    chan struct{}
	holds    *subscribers.Holds // the messages of slots held out of them (see subscriber.Hold); set by allowHold
	assignMu sync.Mutex         // one Assign at a time

	mu       sync.Mutex // guards what follows
	assigned map[int]bool
	runCtx   context.Context       // Subscribe's; nil before it
	ended    bool                  // the subscription ended: nothing starts
	live     map[int]*subscription // consuming
	draining map[int]*subscription // dropped, not done yet
	running  sync.WaitGroup        // the partitions' runs
}

// newPartitions returns the partitions of consumer, n of them, each
// subscription handing out up to limit messages at once between them.
func newPartitions(conn *connection, consumer string, n, limit int) (*partitions, error) {
	exchange := consumer + exchangeSuffix
	if len(exchange) > maxName {
		return nil, fmt.Errorf("amqp: consumer %s: the name is too long for a partitioned consumer (its exchange %s... must be at most %d bytes)", consumer, exchange[:32], maxName)
	}
	args := make(amqp091.Table, len(conn.cfg.queueArguments())+1)
	maps.Copy(args, conn.cfg.queueArguments())
	args["x-single-active-consumer"] = true
	return &partitions{
		conn:     conn,
		consumer: consumer,
		exchange: exchange,
		n:        n,
		args:     args,
		out:      make(chan *message.Message),
		slots:    make(chan struct{}, limit),
		assigned: map[int]bool{},
		live:     map[int]*subscription{},
		draining: map[int]*subscription{},
	}, nil
}

// partitionQueue returns the name of the queue of consumer's partition i.
func partitionQueue(consumer string, i int) string {
	if i < 10 {
		return consumer + ".p0" + strconv.Itoa(i)
	}
	return consumer + ".p" + strconv.Itoa(i)
}

// initialize declares the exchange of topic, the consumer's
// consistent-hash exchange bound to it, and, once, the partitions' queues
// bound to the consistent-hash exchange; it unbinds the queues of
// partitions beyond the consumer's (see unbindBeyond).
func (p *partitions) initialize(topic string) error {
	p.initMu.Lock()
	defer p.initMu.Unlock()
	w, err := p.conn.wrapper()
	if err != nil {
		return err
	}
	if !w.IsConnected() {
		return ErrNotConnected
	}
	conn := w.Connection()
	if err := p.declareExchange(conn); err != nil {
		return err
	}
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	cfg := p.conn.publisherConfig()
	source := cfg.Exchange.GenerateName(topic)
	if err := cfg.TopologyBuilder.ExchangeDeclare(ch, source, cfg); err != nil {
		return fmt.Errorf("declare exchange %s: %w", source, err)
	}
	if err := ch.ExchangeBind(p.exchange, "", source, false, nil); err != nil {
		return fmt.Errorf("bind exchange %s to %s: %w", p.exchange, source, err)
	}
	if p.declared {
		return nil
	}
	// In the partitions' order: a binding made later takes the buckets
	// after those of the bindings made before, by any process.
	for i := range p.n {
		if err := p.declareQueue(ch, i); err != nil {
			return err
		}
	}
	if err := p.unbindBeyond(conn); err != nil {
		return err
	}
	p.declared = true
	return nil
}

// declareExchange declares the consistent-hash exchange unless it exists.
// A broker without the plugin answers the declaration by closing the
// connection (503 COMMAND_INVALID, a connection error), so the exchange is
// declared on a connection of its own, not under the transport's
// publisher and subscriptions.
func (p *partitions) declareExchange(conn *amqp091.Connection) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	err = ch.ExchangeDeclarePassive(p.exchange, kindConsistentHash, true, false, false, false, nil)
	if err == nil {
		_ = ch.Close()
		return nil
	}
	if !isCode(err, amqp091.NotFound) { // the broker closed the channel
		return fmt.Errorf("check exchange %s: %w", p.exchange, err)
	}
	own, err := amqp091.DialConfig(p.conn.brokers.dialURI(), *p.conn.brokers.config())
	if err != nil {
		return fmt.Errorf("declare exchange %s: dial: %w", p.exchange, err)
	}
	defer func() { _ = own.Close() }()
	och, err := own.Channel()
	if err != nil {
		return fmt.Errorf("declare exchange %s: open channel: %w", p.exchange, err)
	}
	err = och.ExchangeDeclare(p.exchange, kindConsistentHash, true, false, false, false, amqp091.Table{"hash-header": PartitionHeader})
	if isCode(err, amqp091.CommandInvalid) { // "unknown exchange type"
		return fmt.Errorf("%w: declare exchange %s: %w", ErrNoConsistentHash, p.exchange, err)
	}
	if err != nil {
		return fmt.Errorf("declare exchange %s: %w", p.exchange, err)
	}
	return nil
}

// declarePartition declares the queue of partition i and its binding, on
// a channel of its own.
func (p *partitions) declarePartition(conn *amqp091.Connection, i int) error {
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("open channel: %w", err)
	}
	defer func() { _ = ch.Close() }()
	return p.declareQueue(ch, i)
}

// declareQueue declares the queue of partition i and binds it to the
// consistent-hash exchange; both are idempotent.
func (p *partitions) declareQueue(ch *amqp091.Channel, i int) error {
	q := partitionQueue(p.consumer, i)
	if _, err := ch.QueueDeclare(q, true, false, false, false, p.args); err != nil {
		return fmt.Errorf("declare queue %s: %w", q, err)
	}
	if err := ch.QueueBind(q, partitionWeight, p.exchange, false, nil); err != nil {
		return fmt.Errorf("bind queue %s to %s: %w", q, p.exchange, err)
	}
	return nil
}

// unbindBeyond unbinds the queues of the partitions at and above n that
// an earlier run with more partitions left (the queues of partitions
// 0..n-1 are made in turn, so those above are contiguous too), the last
// first so that no bucket below moves: bound, they would keep taking
// messages that no process consumes. What they hold stays in them, and a
// warning says how much.
func (p *partitions) unbindBeyond(conn *amqp091.Connection) error {
	var beyond []amqp091.Queue
	for i := p.n; i < driver.MaxPartitions; i++ {
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		q, err := ch.QueueDeclarePassive(partitionQueue(p.consumer, i), true, false, false, false, nil)
		if isCode(err, amqp091.NotFound) {
			break // the broker closed the channel
		}
		_ = ch.Close()
		if err != nil {
			return fmt.Errorf("check queue %s: %w", partitionQueue(p.consumer, i), err)
		}
		beyond = append(beyond, q)
	}
	for i := len(beyond) - 1; i >= 0; i-- {
		q := beyond[i]
		ch, err := conn.Channel()
		if err != nil {
			return fmt.Errorf("open channel: %w", err)
		}
		err = ch.QueueUnbind(q.Name, partitionWeight, p.exchange, nil)
		_ = ch.Close()
		if err != nil && !isCode(err, amqp091.NotFound) {
			return fmt.Errorf("unbind queue %s from %s: %w", q.Name, p.exchange, err)
		}
		p.conn.cfg.Logger.Warn("amqp: a queue of a partition beyond the consumer's is unbound; what it holds stays there",
			"consumer", p.consumer, "partitions", p.n, "queue", q.Name, "messages", q.Messages)
	}
	return nil
}

// isCode reports whether err is the broker's error of code.
func isCode(err error, code int) bool {
	var amqpErr *amqp091.Error
	return errors.As(err, &amqpErr) && amqpErr.Code == code
}

// partitionKeyOf returns the value of PartitionHeader of a message whose
// payload is a CloudEvent: driver.PartitionKey of the event, as a consumer
// decodes it, or as its publisher knew it without decoding the payload
// (pipeline.PartitionKey on its context: the outbox relay's, read from its
// row). ok is false for another payload.
func partitionKeyOf(msg *message.Message) (key string, ok bool) {
	if key, ok := pipeline.From[pipeline.PartitionKey](msg.Context()); ok {
		return string(key), true
	}
	payload := msg.Payload
	env, err := framework.Decode(payload, len(payload)) // any size: the consumer's limit is its own
	if err != nil {
		return "", false
	}
	return driver.PartitionKey(env.Subject, env.ID), true
}
