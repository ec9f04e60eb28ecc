// Package pipeline is the wiring that the consumer chain, the transports,
// the unit of work and the runner share and a user never calls: the
// values a message's context carries between the steps of the chain, the
// error that asks for a later delivery, the replay topics, the
// redelivery marker and how a reader settles a message.
// It imports no package of the module, so that package framework can use
// it too.
package pipeline

import (
	"context"
	"errors"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

type key[T any] struct{}

// With returns ctx carrying v, found again by From[T]: one value per type,
// so each value a step hands on has a type of its own.
func With[T any](ctx context.Context, v T) context.Context {
	return context.WithValue(ctx, key[T]{}, v)
}

// From returns the value of type T that ctx carries (see With).
func From[T any](ctx context.Context) (T, bool) {
	v, ok := ctx.Value(key[T]{}).(T)
	return v, ok
}

// Decoded is a message's event routed to its consumer's handler, with its
// data decoded and validated: what is left is to handle it. E is
// framework.Envelope; the decode step puts a *Decoded[E] on the message's
// context for the steps after it.
type Decoded[E any] struct {
	// Envelope is the decoded CloudEvent.
	Envelope E
	// Consumer is the name of the consumer whose handler it was routed
	// to: the same on a replay, which comes through another topic or
	// queue, under another handler name of the router.
	Consumer string
	// Handle runs the handler on the decoded event.
	Handle func(ctx context.Context) error
}

// Read is a message's CloudEvent as a reader ahead of the consumer chain
// decoded it (the runner's sequencer, which orders a consumer's events by
// their subject): the chain's decode step takes it instead of decoding the
// body again. E is framework.Envelope. Only a body that decoded is
// carried: the chain decodes the others, and dead-letters them.
type Read[E any] struct {
	Envelope E
}

// PartitionKey is the partition key of a message's event (what
// driver.PartitionKey makes of its subject and id) as its publisher read
// it where the event was stored beside its body: the outbox relay puts it
// on the context of each message it publishes, from its row's subject and
// event id, and the AMQP transport's publisher sets the partition header
// from it instead of decoding the body again.
type PartitionKey string

// Attempt is the attempt that a context runs in: the unit of work of
// package driver puts it on the context it gives a handler, and package
// framework reads it (Conn, IdempotencyKeyFromContext) without knowing
// the unit of work.
type Attempt struct {
	// Consumer is the name of the consumer whose attempt it is.
	Consumer string
	// Source and ID are the event's key.
	Source, ID string
	// Conn is the attempt's transaction (a *driver.Tx), nil when the
	// attempt has no database (the in-memory store).
	Conn sqlx.ExtContext
	// Order, when set, is the attempt's strict-order step in a batch
	// that read and locked its subject's checkpoint for it, and that
	// moves the checkpoint before its commit.
	Order *OrderStep
}

// OrderStep is an attempt's strict-order step in a batch of the unit of
// work that reads and locks the checkpoints of all its attempts' subjects
// in one statement, and moves them in one statement before its commit.
type OrderStep struct {
	// Checkpoint is the subject's checkpoint, read and locked by the
	// batch.
	Checkpoint int64
	// Advance, set by the strict-order step of an event at its turn
	// that took effect, asks the batch to move the checkpoint to Seq and
	// end the event's wait before its commit, instead of a statement of
	// the attempt's own.
	Advance bool
	// Seq is the event's subjectseq, with Advance.
	Seq int64
}

// AckOrNack acks msg when err is nil and nacks it otherwise, as the
// router does once its handler returns, and reports which of the two the
// message got: an Ack or Nack of the chain's own comes first. A reader
// that settles its messages itself (the runner) tells the outcome to the
// message's subscriber (driver.Settler).
func AckOrNack(msg *message.Message, err error) (acked bool) {
	if err == nil {
		return msg.Ack()
	}
	return !msg.Nack() // false: it was acked before
}

// ErrLater is returned by a step that wants the message delivered again
// later (a strict-order wait): the chain nacks it without an attempt
// counted or a dead letter.
var ErrLater = errors.New("deliver again later")

// ReplayTopicPrefix starts the topic of each consumer's replays on the SQL
// transports.
const ReplayTopicPrefix = "effectively.replay."

// ReplayTopic returns the topic that only consumer reads on the SQL
// transports: a dead letter replayed to it reaches no other consumer of
// its type. (On AMQP a replay goes straight to the consumer's queue.)
func ReplayTopic(consumer string) string { return ReplayTopicPrefix + consumer }

// MetadataRedelivered is set by a transport that can tell a redelivery:
// "true" when the message was delivered before, "false" when this is its
// first delivery.
const MetadataRedelivered = "effectively_redelivered"

// Redelivered reports whether the transport marked msg as delivered before
// (see MetadataRedelivered); known is false when the transport cannot tell.
func Redelivered(msg *message.Message) (redelivered, known bool) {
	switch msg.Metadata.Get(MetadataRedelivered) {
	case "true":
		return true, true
	case "false":
		return false, true
	default:
		return false, false
	}
}
