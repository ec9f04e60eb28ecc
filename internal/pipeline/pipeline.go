// Package pipeline is the wiring that the consumer chain, the transports,
// the unit of work and the runner share and a user never calls: the
// values a message's context carries between the steps, the error that
// asks for a later delivery, the replay topics and the redelivery marker.
// It imports no package of the module, so that package framework can use
// it too.
package pipeline

import (
	"context"
	"database/sql"
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
}

// AckInTx lets a transport acknowledge a message inside the handler's
// transaction, so that the effect and the ack commit together. A
// transport puts it on the message's context (With); the unit of work
// calls Ack before commit when its database is DB.
type AckInTx struct {
	DB  *sql.DB
	Ack func(ctx context.Context, tx Execer) error
	// Batch, when not nil, acknowledges many messages in one statement: a
	// batch of the unit of work (group commit) hands it, before its
	// commit, the AckInTx of each of its attempts that carries the same
	// Batch, instead of calling their Ack one by one.
	Batch AckBatch
	// Item is what Batch knows the message by (the SQLite subscription's
	// delivery).
	Item any
}

// AckBatch acknowledges, inside the attempts' shared transaction, the
// messages of acks, each of which carries it as its Batch.
type AckBatch interface {
	AckAll(ctx context.Context, tx Execer, acks []AckInTx) error
}

// Execer runs a statement: the attempt's transaction, as a transport's ack
// sees it.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// SettleReported on the context given to a subscriber's Subscribe says
// that the subscription's reader tells the transport each message's
// outcome: the runner acks or nacks every message it is handed once its
// chain returns, then calls the Settler the message's context carries. A
// transport that hands out many messages at once then watches none of
// them with a goroutine of its own; given a context without it (a router
// of the user's own, a test reading the channel), it watches each.
type SettleReported bool

// Reported reports whether ctx carries SettleReported(true).
func Reported(ctx context.Context) bool {
	r, _ := From[SettleReported](ctx)
	return bool(r)
}

// Settler is told a message's outcome by the runner, once, after the
// message was acked or nacked (see SettleReported): a transport puts one
// on the context of each message it hands out.
type Settler interface {
	// Settled says the message was acked (true) or nacked (false). It
	// may block until the subscription takes the outcome, or closes.
	Settled(acked bool)
}

// Settle acks msg when err is nil and nacks it otherwise, as the router
// does once its handler returns, and tells the Settler of msg's context
// which of the two the message got (an Ack or Nack of the chain's own
// comes first). It does nothing to a message without a Settler.
func Settle(msg *message.Message, err error) {
	s, ok := From[Settler](msg.Context())
	if !ok {
		return
	}
	var acked bool
	if err == nil {
		acked = msg.Ack()
	} else {
		acked = !msg.Nack() // false: it was acked before
	}
	s.Settled(acked)
}

// DeliveryCounted on a message's context says that the delivery guard
// recorded the delivery's count: the unit of work forgets the count when
// the effect commits, so that lost acks never add up to the delivery
// limit.
type DeliveryCounted bool

// Counted reports whether ctx carries DeliveryCounted(true).
func Counted(ctx context.Context) bool {
	c, _ := From[DeliveryCounted](ctx)
	return bool(c)
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
