package handlers

import (
	"context"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
)

// The fx value groups the declarations travel in.
const (
	declarationGroup  = `group:"effectively.consumers"`
	registrationGroup = `group:"effectively.handlers"`
)

// Declaration is a consumer declared with Consumer, as collected by the
// Registry.
type Declaration struct {
	Name     string
	Handlers int
	// RenamedFrom lists the names the consumer had before (see
	// RenamedFrom).
	RenamedFrom []string
	// WithoutDedup is the reason the consumer runs without deduplication
	// (see WithoutDedup); empty when it deduplicates, as consumers do.
	WithoutDedup string
	// Types are the event types the consumer receives, sorted: those of
	// its routes (for an Upcast, the older contract's).
	Types []string
}

// Registration is one handler of a declared consumer, built by fx.
type Registration struct {
	Consumer string
	Handler  framework.Handler
}

// Route is one handler of a consumer: an event definition and what handles
// it. Build it with On.
type Route struct {
	provide      func(consumer string) fx.Option
	typ          string // the event type the route receives
	renamedFrom  string
	withoutDedup *string // the reason, when the route is WithoutDedup
}

// WithoutDedup turns deduplication off for the consumer, for the reason
// given: its attempts take no processed mark, so every delivery runs the
// handler, the redelivery of an event already processed included. Put it
// among the consumer's routes:
//
//	consumer := handlers.Register("shop.index-order",
//		handlers.WithoutDedup("the index write is an upsert by order id"),
//		handlers.On(OrderPlaced, NewIndexOrder),
//	)
//
// Use it only for an effect that is idempotent by itself (an upsert of
// the same row, a delete), to save the mark's write. The rest of the chain
// stays: each attempt runs in its transaction under group commit, with
// retries, dead letters and the delivery limit. Without the mark, two
// deliveries of one event may also run at the same time, which the mark
// would have made one wait for the other. The reason is required: an
// empty one refuses start-up, naming the consumer. The application logs
// each such consumer with its reason at start. ExampleWithoutDedup runs
// the declaration above; docs/guarantees.md says what it gives up.
func WithoutDedup(reason string) Route { return Route{withoutDedup: &reason} }

// RenamedFrom says that the consumer had the name old before: the events
// old processed count as processed by the consumer, which would otherwise
// start as a new consumer that has processed nothing. Put it among the
// consumer's routes:
//
//	handlers.Register("notifications.remind-on-appointment-booked",
//		handlers.RenamedFrom("notifications.booking-reminder"),
//		handlers.On(appointments.Booked, NewRemindOnBooked),
//	)
//
// The application adopts old's processed marks at start, once, and on
// the SQL transports old's consumer group's position in each topic: the
// consumer goes on where old stopped. Stop every process of the old name
// first: marks it writes afterwards are not adopted. Messages waiting in
// old's RabbitMQ queue are not moved (see docs/transports.md, "Renaming
// a consumer"). With several old names, put the latest first: in each
// topic, the consumer takes the position of the first one that has one.
func RenamedFrom(old string) Route { return Route{renamedFrom: old} }

// Register declares the consumer name with its routes, one per event type
// and version it handles, and yields the fx option that registers them:
//
//	handlers.Register("notifications.remind-on-appointment-booked",
//		handlers.On(appointments.Booked, NewRemindOnBooked),
//	)
//
// The name is an identity and must be a literal: it keys the processed
// events and names the queue or consumer group. Start-up is refused, naming
// the culprit, for a malformed name (see framework.ValidateConsumerName), a
// name declared twice, no routes, two routes of one type and version, or
// a WithoutDedup without a reason.
func Register(name string, routes ...Route) fx.Option {
	if err := framework.ValidateConsumerName(name); err != nil {
		return fx.Error(fmt.Errorf("handlers: %w", err))
	}
	decl := Declaration{Name: name}
	var opts []fx.Option
	for _, r := range routes {
		switch {
		case r.withoutDedup != nil:
			reason := strings.TrimSpace(*r.withoutDedup)
			if reason == "" {
				return fx.Error(fmt.Errorf("handlers: consumer %s: WithoutDedup needs a reason (say why its effect is idempotent without the processed mark)", name))
			}
			if decl.WithoutDedup != "" {
				return fx.Error(fmt.Errorf("handlers: consumer %s: WithoutDedup given twice", name))
			}
			decl.WithoutDedup = reason
		case r.renamedFrom != "":
			if err := framework.ValidateConsumerName(r.renamedFrom); err != nil {
				return fx.Error(fmt.Errorf("handlers: consumer %s renamed from: %w", name, err))
			}
			if r.renamedFrom == name {
				return fx.Error(fmt.Errorf("handlers: consumer %s is renamed from itself", name))
			}
			decl.RenamedFrom = append(decl.RenamedFrom, r.renamedFrom)
		case r.provide != nil:
			decl.Handlers++
			if !slices.Contains(decl.Types, r.typ) {
				decl.Types = append(decl.Types, r.typ)
			}
			opts = append(opts, r.provide(name))
		default:
			return fx.Error(fmt.Errorf("handlers: consumer %s: zero Route (build it with handlers.On)", name))
		}
	}
	if decl.Handlers == 0 {
		return fx.Error(fmt.Errorf("handlers: consumer %s has no routes (add handlers.On(definition, handler))", name))
	}
	slices.Sort(decl.Types)
	opts = append(opts, fx.Provide(fx.Annotate(
		func() Declaration { return decl },
		fx.ResultTags(declarationGroup),
	)))
	return fx.Module("effectively.consumer."+name, opts...)
}

// On routes events of def to handler, which is one of:
//   - a function func(context.Context, framework.Event[T]) error, or a
//     framework.HandlerFunc[T];
//   - a value with a method Handle(context.Context, framework.Event[T]) error;
//   - a constructor of either: a function whose parameters fx injects and
//     whose results are the handler, optionally followed by an error.
//
// A handler of the wrong shape refuses start-up with an error that names
// the consumer and the event.
func On[T any](def framework.Definition[T], handler any) Route {
	r := route(def.String(), def, handler, func(h framework.HandlerFunc[T]) framework.Handler {
		return framework.Handle(def, h)
	})
	r.typ = def.Type()
	return r
}

// Upcast routes events of an older contract version, from, to the handler
// of the newer one, to: each event is converted with up first (see
// framework.Upcast). handler takes the same forms as in On, for events of
// to; it may be the very constructor given to On(to, ...), and each route
// then gets an instance of its own.
//
//	consumer := handlers.Register("shop.confirm-order-by-mail",
//		handlers.On(OrderPlacedTwo, NewConfirmOrderV2),
//		handlers.Upcast(OrderPlaced, OrderPlacedTwo, UpcastOrderPlaced, NewConfirmOrderV2),
//	)
//
// with OrderPlaced and OrderPlacedTwo the definitions (framework.Define)
// of versions 1 and 2 of one type, and UpcastOrderPlaced a
// func(OrderPlacedV1) (OrderPlacedV2, error); ExampleUpcast runs it.
func Upcast[Old, New any](from framework.Definition[Old], to framework.Definition[New], up func(Old) (New, error), handler any) Route {
	r := route(from.String()+" as "+to.String(), to, handler, func(h framework.HandlerFunc[New]) framework.Handler {
		return framework.Upcast(from, to, up, h)
	})
	r.typ = from.Type()
	return r
}

// route is a Route whose handler, of events of def, is bound into a
// framework.Handler by bind.
func route[T any](name string, def framework.Definition[T], handler any, bind func(framework.HandlerFunc[T]) framework.Handler) Route {
	return Route{
		provide: func(consumer string) fx.Option {
			ctor, err := constructor(def, handler, bind)
			if err != nil {
				return fx.Error(fmt.Errorf("handlers: consumer %s, %s: %w", consumer, name, err))
			}
			return fx.Provide(fx.Annotate(
				wrapConstructor(ctor, consumer),
				fx.ResultTags(registrationGroup),
			))
		},
	}
}

// typedHandler is the method form of a handler.
type typedHandler[T any] interface {
	Handle(ctx context.Context, ev framework.Event[T]) error
}

var errorType = reflect.TypeFor[error]()

// constructor turns handler into a function whose parameters fx injects and
// which returns (framework.Handler, error).
func constructor[T any](_ framework.Definition[T], handler any, bind func(framework.HandlerFunc[T]) framework.Handler) (any, error) {
	if h, ok := asHandlerFunc[T](handler); ok {
		return func() (framework.Handler, error) { return bind(h), nil }, nil
	}
	v := reflect.ValueOf(handler)
	if !v.IsValid() || v.Kind() != reflect.Func || v.IsNil() {
		return nil, fmt.Errorf("handler is %T: want func(context.Context, framework.Event[T]) error, a value with such a Handle method, or a constructor of one", handler)
	}
	t := v.Type()
	if other, ok := otherEvents(t); ok {
		return nil, fmt.Errorf("handler %s handles %s: this route is of %s (give handlers.On the definition of the handler's events, or take %s)",
			t, other, reflect.TypeFor[framework.Event[T]](), reflect.TypeFor[framework.Event[T]]())
	}
	if t.NumOut() < 1 || t.NumOut() > 2 || (t.NumOut() == 2 && t.Out(1) != errorType) || t.IsVariadic() {
		return nil, fmt.Errorf("constructor %s must return the handler, optionally with an error", t)
	}
	if !resultIsHandler[T](t.Out(0)) {
		return nil, fmt.Errorf("constructor %s returns %s: want func(context.Context, framework.Event[T]) error or a value with such a Handle method", t, t.Out(0))
	}
	in := make([]reflect.Type, t.NumIn())
	for i := range in {
		in[i] = t.In(i)
	}
	out := []reflect.Type{reflect.TypeFor[framework.Handler](), errorType}
	fn := reflect.MakeFunc(reflect.FuncOf(in, out, false), func(args []reflect.Value) []reflect.Value {
		res := v.Call(args)
		if len(res) == 2 && !res[1].IsNil() {
			return []reflect.Value{reflect.Zero(out[0]), res[1]}
		}
		h, _ := asHandlerFunc[T](res[0].Interface())
		if h == nil {
			err := fmt.Errorf("constructor %s returned a nil handler", t)
			return []reflect.Value{reflect.Zero(out[0]), reflect.ValueOf(&err).Elem()}
		}
		return []reflect.Value{reflect.ValueOf(bind(h)), reflect.Zero(errorType)}
	})
	return fn.Interface(), nil
}

// otherEvents reports whether t has the shape of a handler,
// func(context.Context, framework.Event[X]) error, and returns
// framework.Event[X]: constructor meets it only when X is not the
// route's event type, and says so instead of taking it for a
// constructor.
func otherEvents(t reflect.Type) (reflect.Type, bool) {
	if t.NumIn() != 2 || t.NumOut() != 1 || t.Out(0) != errorType || t.In(0) != reflect.TypeFor[context.Context]() {
		return nil, false
	}
	ev, event := t.In(1), reflect.TypeFor[framework.Event[struct{}]]()
	if ev.PkgPath() != event.PkgPath() || !strings.HasPrefix(ev.Name(), "Event[") {
		return nil, false
	}
	return ev, true
}

func resultIsHandler[T any](t reflect.Type) bool {
	fnType := reflect.TypeFor[func(context.Context, framework.Event[T]) error]()
	return t.ConvertibleTo(fnType) && t.Kind() == reflect.Func ||
		t.Implements(reflect.TypeFor[typedHandler[T]]())
}

// asHandlerFunc returns h as a HandlerFunc when it is one of the handler
// forms; a nil function or value gives (nil, true) for a handler form.
func asHandlerFunc[T any](h any) (framework.HandlerFunc[T], bool) {
	switch h := h.(type) {
	case framework.HandlerFunc[T]:
		return h, true
	case func(context.Context, framework.Event[T]) error:
		return h, true
	case typedHandler[T]:
		if v := reflect.ValueOf(h); (v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface) && v.IsNil() {
			return nil, true
		}
		return h.Handle, true
	}
	return nil, false
}

// wrapConstructor returns a function with ctor's parameters that returns a
// Registration of consumer.
func wrapConstructor(ctor any, consumer string) any {
	v := reflect.ValueOf(ctor)
	t := v.Type()
	in := make([]reflect.Type, t.NumIn())
	for i := range in {
		in[i] = t.In(i)
	}
	out := []reflect.Type{reflect.TypeFor[Registration](), errorType}
	return reflect.MakeFunc(reflect.FuncOf(in, out, false), func(args []reflect.Value) []reflect.Value {
		res := v.Call(args)
		if !res[1].IsNil() {
			return []reflect.Value{reflect.Zero(out[0]), res[1]}
		}
		reg := Registration{Consumer: consumer, Handler: res[0].Interface().(framework.Handler)}
		return []reflect.Value{reflect.ValueOf(reg), reflect.Zero(errorType)}
	}).Interface()
}

// registryParams are what NewRegistry takes from fx.
type registryParams struct {
	fx.In

	Declarations  []Declaration  `group:"effectively.consumers"`
	Registrations []Registration `group:"effectively.handlers"`
}

// Registry holds every declared consumer, checked.
type Registry struct {
	consumers    []*framework.Consumer
	renamedFrom  map[string][]string
	withoutDedup map[string]string
}

// CheckDeclarations checks what the declarations alone tell, as the
// Registry does before it builds any handler: it refuses a consumer name
// declared twice, and a name that a consumer is renamed from while it is
// still declared or that two consumers are renamed from. The commands that
// need the declarations and not the handlers (the operator's) call it, so
// that they refuse what the service refuses at start.
func CheckDeclarations(decls []Declaration) error {
	_, err := checkDeclarations(decls)
	return err
}

// checkDeclarations is CheckDeclarations; it returns the names each
// consumer is renamed from.
func checkDeclarations(decls []Declaration) (renamed map[string][]string, err error) {
	declared := make(map[string]bool, len(decls))
	var dups []string
	for _, d := range decls {
		if declared[d.Name] {
			dups = append(dups, d.Name)
		}
		declared[d.Name] = true
	}
	if len(dups) > 0 {
		slices.Sort(dups)
		return nil, fmt.Errorf("handlers: consumer name declared more than once: %s (a consumer name is an identity; give each consumer its own, or declare all its routes in one handlers.Register)", strings.Join(dups, ", "))
	}
	renamed = make(map[string][]string)
	claimed := make(map[string]string) // old name -> the consumer that claims it
	for _, d := range decls {
		for _, old := range d.RenamedFrom {
			if declared[old] {
				return nil, fmt.Errorf("handlers: consumer %s is renamed from %s, which is still declared", d.Name, old)
			}
			if other, ok := claimed[old]; ok && other != d.Name {
				return nil, fmt.Errorf("handlers: consumers %s and %s are both renamed from %s", min(other, d.Name), max(other, d.Name), old)
			}
			claimed[old] = d.Name
			renamed[d.Name] = append(renamed[d.Name], old)
		}
	}
	return renamed, nil
}

// newRegistry checks the declarations and builds the consumers. It refuses
// what CheckDeclarations refuses, and two handlers of one consumer for the
// same event type and version, naming them.
func newRegistry(p registryParams) (*Registry, error) {
	renamed, err := checkDeclarations(p.Declarations)
	if err != nil {
		return nil, err
	}
	declared := make(map[string]bool, len(p.Declarations))
	withoutDedup := make(map[string]string)
	for _, d := range p.Declarations {
		declared[d.Name] = true
		if d.WithoutDedup != "" {
			withoutDedup[d.Name] = d.WithoutDedup
		}
	}
	byConsumer := make(map[string][]framework.Handler)
	for _, r := range p.Registrations {
		byConsumer[r.Consumer] = append(byConsumer[r.Consumer], r.Handler)
	}
	names := make([]string, 0, len(declared))
	for name := range declared {
		names = append(names, name)
	}
	slices.Sort(names)
	reg := &Registry{renamedFrom: renamed, withoutDedup: withoutDedup}
	for _, name := range names {
		c, err := framework.NewConsumer(name, byConsumer[name]...)
		if err != nil {
			return nil, fmt.Errorf("handlers: %w", err)
		}
		reg.consumers = append(reg.consumers, c)
	}
	return reg, nil
}

// RenamedFrom returns the names consumer had before (see RenamedFrom).
func (r *Registry) RenamedFrom(consumer string) []string {
	return slices.Clone(r.renamedFrom[consumer])
}

// WithoutDedup returns the reason consumer runs without deduplication,
// and false when it deduplicates (see WithoutDedup).
func (r *Registry) WithoutDedup(consumer string) (reason string, ok bool) {
	reason, ok = r.withoutDedup[consumer]
	return reason, ok
}

// Consumers returns the consumers, sorted by name.
func (r *Registry) Consumers() []*framework.Consumer { return slices.Clone(r.consumers) }

// Module provides the *Registry of every consumer declared in the
// application.
var Module = fx.Module("effectively.handlers", fx.Provide(newRegistry))
