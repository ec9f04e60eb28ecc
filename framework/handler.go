package framework

import (
	"context"
	"fmt"
	"slices"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// HandlerFunc handles events of one definition. It returns nil when the
// effect is done, a plain error to have the attempt retried, or a
// Permanent error to have the message dead-lettered at once. Everything it
// writes through the attempt's transaction (Conn) commits
// exactly once per event.
type HandlerFunc[T any] func(ctx context.Context, ev Event[T]) error

// Handler is a handler of one event definition with its type erased, so
// that a consumer can hold handlers of several event types. Build it with
// Handle.
type Handler struct {
	typ     string
	version int
	// route decodes an event's data and returns the call of the handler
	// on it (see Consumer.Route).
	route func(env Envelope) (handle func(ctx context.Context) error, err error)
}

// Handle pairs a definition with a function that handles its events.
func Handle[T any](def Definition[T], fn HandlerFunc[T]) Handler {
	return Handler{
		typ:     def.typ,
		version: def.version,
		route: func(env Envelope) (func(ctx context.Context) error, error) {
			ev := new(Event[T]) // decoded in place: the one copy the call holds
			if err := def.decodeInto(env, ev); err != nil {
				return nil, err
			}
			return func(ctx context.Context) error { return fn(ctx, *ev) }, nil
		},
	}
}

// Type returns the event type the handler handles.
func (h Handler) Type() string { return h.typ }

// Version returns the contract version the handler handles.
func (h Handler) Version() int { return h.version }

// Consumer is a named set of handlers, at most one per event type and
// version, sharing one deduplication key space: an event is processed once
// per consumer whichever handler takes it.
type Consumer struct {
	name     string
	handlers map[string]map[int]Handler
}

// NewConsumer returns the consumer name with handlers. It fails on a
// malformed name (see ValidateConsumerName), no handlers, a zero Handler or
// two handlers of one event type and version.
func NewConsumer(name string, handlers ...Handler) (*Consumer, error) {
	if err := ValidateConsumerName(name); err != nil {
		return nil, err
	}
	if len(handlers) == 0 {
		return nil, fmt.Errorf("consumer %s has no handlers", name)
	}
	c := &Consumer{name: name, handlers: make(map[string]map[int]Handler)}
	for _, h := range handlers {
		if h.route == nil {
			return nil, fmt.Errorf("consumer %s: zero Handler (build it with framework.Handle)", name)
		}
		versions := c.handlers[h.typ]
		if versions == nil {
			versions = make(map[int]Handler)
			c.handlers[h.typ] = versions
		}
		if _, dup := versions[h.version]; dup {
			return nil, fmt.Errorf("consumer %s has two handlers of %s v%d", name, h.typ, h.version)
		}
		versions[h.version] = h
	}
	return c, nil
}

// Name returns the consumer's name.
func (c *Consumer) Name() string { return c.name }

// Types returns the event types the consumer handles, sorted.
func (c *Consumer) Types() []string {
	types := make([]string, 0, len(c.handlers))
	for t := range c.handlers {
		types = append(types, t)
	}
	slices.Sort(types)
	return types
}

// Route finds the consumer's handler of env's type and version and decodes
// env's data for it; handle runs the handler on the decoded event. Every
// error is permanent: CodeUnknownType, CodeUnsupportedVersion or
// CodeInvalidPayload. A test can route an envelope to a consumer's handler
// without a database this way.
func (c *Consumer) Route(env Envelope) (handle func(ctx context.Context) error, err error) {
	versions, ok := c.handlers[env.Type]
	if !ok {
		return nil, Permanent(CodeUnknownType, fmt.Errorf("consumer %s does not handle %s", c.name, env.Type))
	}
	h, ok := versions[env.Version]
	if !ok {
		return nil, Permanent(CodeUnsupportedVersion, fmt.Errorf("consumer %s does not handle %s v%d", c.name, env.Type, env.Version))
	}
	return h.route(env)
}

// EnvelopeFromContext returns the event of the message whose context ctx
// is (or derives from), once the chain decoded it: what an application's
// own middleware reads to act on an event's attributes.
func EnvelopeFromContext(ctx context.Context) (Envelope, bool) {
	d, ok := pipeline.From[*pipeline.Decoded[Envelope]](ctx)
	if !ok {
		return Envelope{}, false
	}
	return d.Envelope, true
}

// ConsumerFromContext returns the name of the consumer that handles the
// message whose context ctx is (or derives from), once the chain decoded
// and routed it: what an application's own middleware (Outer or Inner)
// reads to act per consumer. It is the consumer's name whatever brought
// the message: a replay, which reaches the consumer through a topic or
// queue of its own under another handler name of the router, gives the
// same name as the first delivery.
func ConsumerFromContext(ctx context.Context) (string, bool) {
	d, ok := pipeline.From[*pipeline.Decoded[Envelope]](ctx)
	if !ok {
		return "", false
	}
	return d.Consumer, true
}

// Upcast handles the events of an older contract version with the handler
// of the newer one: each event of from is decoded and validated as from
// says, converted with up, validated as to says, and handed to fn as an
// event of to (its Version is to's). The consumer then handles both
// versions with one function while producers move on. A conversion that
// fails is permanent, with CodeInvalidPayload.
//
// With definitions Booked1 of payload BookedV1 and Booked2 of BookedV2:
//
//	framework.NewConsumer("notifications.remind",
//		framework.Handle(Booked2, remind),
//		framework.Upcast(Booked1, Booked2, func(v1 BookedV1) (BookedV2, error) {
//			return BookedV2{AppointmentID: v1.AppointmentID, StartsAt: v1.StartsAt, TimeZone: "UTC"}, nil
//		}, remind),
//	)
func Upcast[Old, New any](from Definition[Old], to Definition[New], up func(Old) (New, error), fn HandlerFunc[New]) Handler {
	return Handler{
		typ:     from.typ,
		version: from.version,
		route: func(env Envelope) (func(ctx context.Context) error, error) {
			old, err := from.Decode(env)
			if err != nil {
				return nil, err
			}
			data, err := up(old.Data)
			if err != nil {
				return nil, Permanent(CodeInvalidPayload, fmt.Errorf("upcast %s to %s: %w", from, to, fieldError("data", "data", "upcast failed", err)))
			}
			if err := to.check(&data); err != nil {
				return nil, fmt.Errorf("upcast %s to %s: %w", from, to, err)
			}
			attrs := old.Attributes
			attrs.Type, attrs.Version = to.typ, to.version
			ev := Event[New]{Attributes: attrs, Data: data}
			return func(ctx context.Context) error { return fn(ctx, ev) }, nil
		},
	}
}
