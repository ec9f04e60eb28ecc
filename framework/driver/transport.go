package driver

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// ErrUnroutable is returned, wrapped, by the wait of a publish whose
// broker took the message but had nowhere to route it (on RabbitMQ, no
// queue bound to the event type's exchange): no consumer will ever see
// it. The outbox relay leaves such a row unsent, unless its type may be
// dropped (outbox.RelayConfig.DropUnroutable).
var ErrUnroutable = errors.New("no queue bound: the broker routed the message nowhere")

// ErrTopicRefused is returned, wrapped, by a publish whose broker refuses
// the topic itself (on RabbitMQ, the event type's exchange cannot be
// declared: one of that name exists as another kind, or the user may not
// declare it). No message of the topic is published until an operator
// changes the broker; the outbox relay leaves such a row unsent, and the
// rows of other types flow.
var ErrTopicRefused = errors.New("the broker refuses the topic")

// Transport is the broker side of a service: the publisher of its events,
// the subscriptions of its consumers, and the replay of dead letters to
// one consumer. The sqlite, postgres, amqp and memory packages implement
// it, each built by its New.
//
// A transport owns what it builds: Close closes the publisher, every
// subscriber that Subscribe returned and the connections the transport
// opened, but never a database handed to New.
type Transport interface {
	// Publisher publishes events to their type's topic.
	Publisher() message.Publisher
	// Subscribe returns the subscriber of a consumer and the topic of
	// each router handler it needs. Call Initialize on the Subscription
	// before anything is published that the consumer must not miss.
	Subscribe(cfg SubscribeConfig) (Subscription, error)
	// Replay publishes msgs (dead letters being replayed) to consumer
	// alone: other consumers of the same event type do not see them
	// again. A message the transport can never publish fails with a
	// permanent error (see Permanent) naming why in its code, and the
	// service's replay relay dead-letters it again instead of trying
	// again.
	Replay(ctx context.Context, consumer string, msgs ...*message.Message) error
	// Ready reports whether the transport can deliver now (false while a
	// broker connection is down).
	Ready() bool
	// Close closes what the transport built.
	Close() error
}

// SubscribeConfig describes the consumer that Transport.Subscribe
// subscribes: its name, its event types and how it handles a message.
type SubscribeConfig struct {
	// Consumer is the consumer's name, which names its consumer group or
	// queue. Required.
	Consumer string
	// Types are the event types the consumer handles. Required.
	Types []string
	// Concurrency is how many messages the consumer handles at once.
	// Defaults to 1.
	Concurrency int
	// AttemptTimeout bounds one attempt at a message. A transport that
	// leases messages sizes its lease from it. Zero leaves the
	// transport's configured lease.
	AttemptTimeout time.Duration
	// HandlingTime is the longest a healthy message's handling takes, all
	// its attempts and the pauses between them. A transport whose lease
	// is not renewed sizes it from it. Zero leaves the transport's
	// configured lease.
	HandlingTime time.Duration
	// Partitions, above 1, splits the consumer's messages into that many
	// partitions by PartitionOf (on RabbitMQ, by its consistent-hash
	// exchange): the subscription's Subscriber is then an Assigner, and
	// consumes no partition until assigned. A message it hands out
	// carries its partition (PartitionFromContext). A transport that
	// cannot partition refuses it. Defaults to 1: not partitioned.
	Partitions int
	// Settles says that the subscription's reader settles each message
	// itself, as the runner does: it acks or nacks every message it is
	// handed once its handling returned, then tells the subscriber which
	// (Settler). A transport that hands out many messages at once then
	// watches none of them with a goroutine of its own. Without it (a
	// router of the user's own, a test reading the channel) the
	// transport watches each message's Ack and Nack itself. Such a
	// reader reads the subscription's channel until it closes: when the
	// subscription ends, a transport may hand out what it received and
	// held for the reader (the AMQP transport's prefetch), so that the
	// reader, which is stopping, hands each back itself (a first
	// delivery is then recorded as costing nothing: see
	// Store.Count). Defaults to false.
	Settles bool
	// Hold is how many messages the reader may keep out of the window at
	// once (see Holder): a transport that is a Holder makes room for
	// them besides the window (a broker's prefetch, a reader's buffer).
	// The runner sets it for an ordered consumer. Defaults to zero: none.
	Hold int
	// FormerNames are the names the consumer had before
	// (handlers.RenamedFrom). A transport whose replay topics keep their
	// messages (the SQL transports) subscribes the consumer to their
	// replay topics too (see ReplayTopics), so that a replay published
	// to a former name and not yet read reaches the consumer; the
	// consumer group's position there is the former name's (see
	// GroupAdopter). Defaults to none.
	FormerNames []string
}

// ReplayTopics returns the replay topics of a transport whose replay
// topics keep their messages: the consumer's, then each former name's
// (FormerNames) that is not the consumer's own.
func (c SubscribeConfig) ReplayTopics() []string {
	topics := []string{pipeline.ReplayTopic(c.Consumer)}
	for _, old := range c.FormerNames {
		if t := pipeline.ReplayTopic(old); old != "" && !slices.Contains(topics, t) {
			topics = append(topics, t)
		}
	}
	return topics
}

// WithDefaults returns a copy of c with zero fields set to their defaults.
func (c SubscribeConfig) WithDefaults() SubscribeConfig {
	c.Concurrency = max(c.Concurrency, 1)
	c.Partitions = max(c.Partitions, 1)
	return c
}

// Validate reports the first invalid field of c.
func (c SubscribeConfig) Validate() error {
	switch {
	case c.Consumer == "":
		return fmt.Errorf("SubscribeConfig.Consumer: required")
	case len(c.Types) == 0:
		return fmt.Errorf("SubscribeConfig.Types: consumer %s handles no type", c.Consumer)
	case c.Concurrency < 1:
		return fmt.Errorf("SubscribeConfig.Concurrency: must be at least 1, got %d", c.Concurrency)
	case c.AttemptTimeout < 0:
		return fmt.Errorf("SubscribeConfig.AttemptTimeout: must not be negative, got %s", c.AttemptTimeout)
	case c.HandlingTime < 0:
		return fmt.Errorf("SubscribeConfig.HandlingTime: must not be negative, got %s", c.HandlingTime)
	case c.Hold < 0:
		return fmt.Errorf("SubscribeConfig.Hold: must not be negative, got %d", c.Hold)
	}
	if err := validPartitions(c.Partitions); err != nil {
		return fmt.Errorf("SubscribeConfig.Partitions: %w", err)
	}
	return nil
}

// Subscription is what a router needs of a consumer's subscription: its
// subscriber, and the topic of each of its router handlers (a topic may
// appear more than once: one handler per entry).
type Subscription struct {
	// Subscriber is the consumer's subscriber.
	Subscriber message.Subscriber
	// Topics are the topics of the consumer's router handlers.
	Topics []string
	// Bind are the topics to initialize before anything is published
	// (see Initialize); empty when the transport needs no such step.
	Bind []string
	// Conns is how many connections of the stores' database pool the
	// subscription's messages may hold at once: each message in flight
	// holds one at a time (its attempt's transaction; before it the
	// delivery guard's count, after it its dead letter). How many are in
	// flight is the transport's to say. A service sizes that pool from
	// the Conns of its consumers' subscriptions.
	Conns int
	// SubscriberConns is how many connections of the database given to
	// the transport's New the subscriber itself may hold at once (claims,
	// acks, cleanup, a watch for new messages), besides its messages';
	// zero when it holds none there. A service whose transport shares the
	// stores' database adds them to that pool.
	SubscriberConns int
}

// Initialize binds the subscription to its topics (the subscriber's
// SubscribeInitialize), so that the consumer keeps every message
// published from now on, even before it first subscribes.
func (s Subscription) Initialize() error {
	init, ok := s.Subscriber.(message.SubscribeInitializer)
	if !ok {
		return nil
	}
	for _, topic := range s.Bind {
		if err := init.SubscribeInitialize(topic); err != nil {
			return fmt.Errorf("subscribe to %s: %w", topic, err)
		}
	}
	return nil
}

// DecodeMessage decodes msg's payload (see Decode). A message that its
// transport marked unreadable (see MetadataUnreadable) fails permanently
// with CodeUnreadableMessage, whatever its payload.
func DecodeMessage(msg *message.Message, maxBody int) (framework.Envelope, error) {
	if reason, ok := msg.Metadata[framework.MetadataUnreadable]; ok {
		return framework.Envelope{}, framework.Permanent(framework.CodeUnreadableMessage, fmt.Errorf("message %s: unreadable: %s", msg.UUID, reason))
	}
	env, err := framework.Decode(msg.Payload, maxBody)
	if err != nil {
		return framework.Envelope{}, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	return env, nil
}

// CheckBodySize returns Decode's permanent CodeTooLarge error of a body
// over maxBody bytes (zero means DefaultMaxBodyBytes), nil for one within:
// a producer checks with it what its consumers will take (Decode's own
// check).
func CheckBodySize(body []byte, maxBody int) error {
	if maxBody <= 0 {
		maxBody = framework.DefaultMaxBodyBytes
	}
	if len(body) > maxBody {
		return framework.Permanent(framework.CodeTooLarge, &framework.FieldError{Field: "body", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(body), maxBody)})
	}
	return nil
}

// Settler is implemented by a Subscriber that a reader which settles its
// messages itself (SubscribeConfig.Settles) tells each message's outcome.
type Settler interface {
	// Settle says that msg, which the subscriber handed out, was acked
	// (true) or nacked (false). The reader calls it once for each
	// message, after the message's Ack or Nack. It may block until the
	// subscription takes the outcome, or closes. A message the
	// subscriber did not hand out is ignored.
	Settle(msg *message.Message, acked bool)
}

// Holder is implemented by a Subscriber whose reader may keep some of its
// messages waiting in memory without their holding places of the
// subscription's window (the Concurrency messages handed out and not
// settled at once), up to SubscribeConfig.Hold of them. An ordered
// consumer's reader holds so the events of a subject beyond the subject's
// share of the window while they wait for their turn, so that a hot
// subject does not fill the window and the other subjects' events keep
// coming.
type Holder interface {
	// Hold says that msg, handed out by the subscriber and not settled,
	// waits in the reader's memory: its place in the window goes to
	// another message, and its settling later frees none. It reports
	// false, and changes nothing, when the subscription holds
	// SubscribeConfig.Hold messages so already, or msg is not the
	// subscriber's or not in flight.
	Hold(msg *message.Message) bool
}

// TxAcker is implemented by a Subscriber that can acknowledge its
// messages inside the transaction of their attempt, so that the effect
// and the ack commit together, or roll back together (the sqlite
// transport's). The consumer chain asks it for the ack of each message
// and hands it to the unit of work (see Delivery), which writes it before
// its commit when its database is the ack's.
type TxAcker interface {
	// TxAck returns the ack of msg inside a transaction; false when msg
	// is not a message the subscriber handed out.
	TxAck(msg *message.Message) (TxAck, bool)
}

// TxAck acknowledges one message inside a transaction of DB: Batch writes
// the acks of all the attempts of a batch of the unit of work (group
// commit) that carry it, in one statement, given the Item of each.
type TxAck struct {
	// DB is the database in whose transactions the ack is written. The
	// unit of work writes it only in a transaction of its own database;
	// otherwise the message is acked as any other.
	DB *sql.DB
	// Batch writes the ack. Required.
	Batch TxAckBatch
	// Item is what Batch knows the message by.
	Item any
}

// TxAckBatch acknowledges messages inside a transaction (see TxAck).
type TxAckBatch interface {
	// AckInTx acknowledges the messages of items inside tx, the
	// transaction of their attempts: the acks commit with it, or roll
	// back with it.
	AckInTx(ctx context.Context, tx *Tx, items []any) error
}
