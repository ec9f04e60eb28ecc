package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/google/uuid"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// Validator is implemented by payloads that check themselves. Definitions
// call Validate when they build and when they decode an event. Return a
// *FieldError to name the field at fault; the text of any other error is
// left out of the decode error, which is logged, since it may quote the
// value.
type Validator interface {
	Validate() error
}

// Definition is a versioned event contract: an event type, the version of
// its data's contract and the Go type of the data. Define one per version,
// as a package-level value shared by producers and consumers:
//
//	type BookedV1 struct {
//		AppointmentID string    `json:"appointmentId" validate:"required"`
//		StartsAt      time.Time `json:"startsAt" validate:"required"`
//	}
//
//	var Booked = framework.Define[BookedV1]("appointments.appointment.booked", 1)
//
// Data is validated at the boundary, when an event is built and when it is
// decoded: by the payload's own Validate method when it has one (see
// Validator), and by the `validate` struct tags of
// github.com/go-playground/validator when the type has any.
type Definition[T any] struct {
	typ      string
	version  int
	validate *validator.Validate // nil when T has no validate tags
	self     selfCheck
}

// selfCheck says how a definition calls the Validate method of its data:
// found once, when the definition is built, so that checking an event
// boxes nothing.
type selfCheck uint8

const (
	// The zero selfCheck: the data has no Validate method.
	_ selfCheck = iota
	// selfCheckValue: T's methods hold Validate; it is called through the
	// data's address, on a copy as for any value receiver.
	selfCheckValue
	// selfCheckCopy: only *T's methods hold Validate; it is called on a
	// copy of the data, whose changes are dropped.
	selfCheckCopy
	// selfCheckDynamic: T is a pointer or an interface; Validate is called
	// when the value in it has the method.
	selfCheckDynamic
)

// NewDefinition returns the definition of version of event type typ with
// data of type T. The type must not be empty nor longer than MaxTypeBytes,
// nor start with "amq." or "effectively.replay." (the topics of RabbitMQ's
// own exchanges and of each consumer's replays), and the version must be
// 1 or more.
func NewDefinition[T any](typ string, version int) (Definition[T], error) {
	if typ == "" {
		return Definition[T]{}, errors.New("event type is empty")
	}
	if len(typ) > MaxTypeBytes {
		return Definition[T]{}, fmt.Errorf("event type of %d bytes: at most %d allowed", len(typ), MaxTypeBytes)
	}
	// A type names its topic: RabbitMQ refuses to declare an exchange
	// named amq.*, and the SQL transports' replay topics of each consumer
	// are pipeline.ReplayTopicPrefix + its name, which a type must not
	// subscribe or publish to.
	for _, r := range []struct{ prefix, owner string }{
		{"amq.", "RabbitMQ's own exchanges"},
		{pipeline.ReplayTopicPrefix, "each consumer's replays"},
	} {
		if strings.HasPrefix(typ, r.prefix) {
			return Definition[T]{}, fmt.Errorf("event type %q starts with %s, which names the topics of %s", typ, r.prefix, r.owner)
		}
	}
	if version < 1 || version > 1<<31-1 {
		return Definition[T]{}, fmt.Errorf("event %s: version %d out of range 1..2^31-1", typ, version)
	}
	d := Definition[T]{typ: typ, version: version}
	t := reflect.TypeFor[T]()
	if (t.Kind() == reflect.Struct || t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct) && hasValidateTags(t) {
		d.validate = validator.New(validator.WithRequiredStructEnabled())
		d.validate.RegisterTagNameFunc(jsonName) // errors name fields as the wire does
	}
	switch v := reflect.TypeFor[Validator](); {
	case t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface:
		d.self = selfCheckDynamic
	case t.Implements(v):
		d.self = selfCheckValue
	case reflect.PointerTo(t).Implements(v):
		d.self = selfCheckCopy
	}
	return d, nil
}

// Define is NewDefinition for package-level literals: it panics when typ
// or version is invalid, like regexp.MustCompile.
func Define[T any](typ string, version int) Definition[T] {
	d, err := NewDefinition[T](typ, version)
	if err != nil {
		panic(err)
	}
	return d
}

// Type returns the event type.
func (d Definition[T]) Type() string { return d.typ }

// Version returns the data's contract version.
func (d Definition[T]) Version() int { return d.version }

// String returns "type v<version>".
func (d Definition[T]) String() string { return fmt.Sprintf("%s v%d", d.typ, d.version) }

// Event is a decoded event: its attributes and its typed data.
type Event[T any] struct {
	Attributes
	Data T
}

// Envelope encodes the event's data as JSON.
func (e Event[T]) Envelope() (Envelope, error) {
	data, err := json.Marshal(e.Data)
	if err != nil {
		return Envelope{}, fmt.Errorf("encode data of %s: %w", e.Key(), err)
	}
	return Envelope{Attributes: e.Attributes, Data: data}, nil
}

// New builds an event of this definition from data and attrs. Type and
// Version come from the definition; an empty ID becomes a new UUIDv7 and a
// zero Time the current time. Source is required; data must validate.
func (d Definition[T]) New(data T, attrs Attributes) (Event[T], error) {
	if d.typ == "" {
		return Event[T]{}, errors.New("zero Definition: create it with Define or NewDefinition")
	}
	attrs.Type, attrs.Version = d.typ, d.version
	if attrs.ID == "" {
		id, err := uuid.NewV7()
		if err != nil {
			return Event[T]{}, fmt.Errorf("generate event id: %w", err)
		}
		attrs.ID = id.String()
	}
	if attrs.Time.IsZero() {
		attrs.Time = time.Now().UTC()
	}
	if err := attrs.Validate(); err != nil {
		return Event[T]{}, fmt.Errorf("new %s: %w", d, err)
	}
	if err := d.check(&data); err != nil {
		return Event[T]{}, fmt.Errorf("new %s: %w", d, err)
	}
	return Event[T]{Attributes: attrs, Data: data}, nil
}

// Envelope builds an event (see New) and encodes its data.
func (d Definition[T]) Envelope(data T, attrs Attributes) (Envelope, error) {
	ev, err := d.New(data, attrs)
	if err != nil {
		return Envelope{}, err
	}
	return ev.Envelope()
}

// Decode decodes env's data into an event of this definition. Every error
// is permanent: CodeUnknownType or CodeUnsupportedVersion when env is of
// another type or version, CodeInvalidPayload when the data does not decode
// or validate; the latter wraps a FieldError, which names the field and
// never quotes its value.
func (d Definition[T]) Decode(env Envelope) (Event[T], error) {
	var ev Event[T]
	if err := d.decodeInto(env, &ev); err != nil {
		return Event[T]{}, err
	}
	return ev, nil
}

// decodeInto is Decode into ev, which it leaves partly set on error.
func (d Definition[T]) decodeInto(env Envelope, ev *Event[T]) error {
	if env.Type != d.typ {
		return Permanent(CodeUnknownType, fmt.Errorf("event type %q, want %q", env.Type, d.typ))
	}
	if env.Version != d.version {
		return Permanent(CodeUnsupportedVersion, fmt.Errorf("%s version %d, want %d", env.Type, env.Version, d.version))
	}
	if err := json.Unmarshal(env.Data, &ev.Data); err != nil {
		return Permanent(CodeInvalidPayload, fmt.Errorf("decode data of %s: %w", d, undecodable[T](env.Data, err)))
	}
	if err := d.check(&ev.Data); err != nil {
		return err
	}
	ev.Attributes = env.Attributes
	return nil
}

// check validates *data; its errors are permanent with CodeInvalidPayload
// and wrap a FieldError. Nothing it does changes *data.
func (d Definition[T]) check(data *T) error {
	if v, ok := d.selfValidator(data); ok {
		if err := v.Validate(); err != nil {
			return d.invalid(fieldError("data", "data", "rejected by its Validate method", err))
		}
	}
	if d.validate != nil {
		// A struct by value, not by its address: the validator would copy
		// each addressable field it reads.
		if err := d.validate.Struct(*data); err != nil {
			return d.invalid(untagged(err))
		}
	}
	return nil
}

// selfValidator returns the Validator of *data, if its type has one (see
// selfCheck).
func (d Definition[T]) selfValidator(data *T) (Validator, bool) {
	switch d.self {
	case selfCheckValue:
		return any(data).(Validator), true
	case selfCheckCopy:
		c := *data
		return any(&c).(Validator), true
	case selfCheckDynamic:
		v, ok := any(*data).(Validator)
		return v, ok
	}
	return nil, false
}

func (d Definition[T]) invalid(err *FieldError) error {
	return Permanent(CodeInvalidPayload, fmt.Errorf("validate data of %s: %w", d, err))
}

// untagged names the first field that failed its `validate` tag, and the
// tag, without the value.
func untagged(err error) *FieldError {
	fields, ok := errors.AsType[validator.ValidationErrors](err)
	if !ok || len(fields) == 0 {
		return &FieldError{Field: "data", Reason: "invalid", Err: err}
	}
	f := fields[0]
	field := "data"
	if _, path, ok := strings.Cut(f.Namespace(), "."); ok {
		field += "." + path // the path without the root type
	}
	reason := "failed " + f.Tag()
	if f.Param() != "" {
		reason += "=" + f.Param()
	}
	if len(fields) > 1 {
		reason += fmt.Sprintf(" (and %d more)", len(fields)-1)
	}
	return &FieldError{Field: field, Reason: reason, Err: err}
}

// undecodable names the field of data that err, a failure to decode data
// into a T, is about, without the value (the errors of encoding/json and of
// UnmarshalJSON methods, time.Time's included, quote it).
func undecodable[T any](data []byte, err error) *FieldError {
	if syntax, ok := errors.AsType[*json.SyntaxError](err); ok {
		return &FieldError{Field: "data", Reason: fmt.Sprintf("not valid JSON (at byte %d)", syntax.Offset), Err: err}
	}
	if typ, ok := errors.AsType[*json.UnmarshalTypeError](err); ok {
		field := "data"
		if typ.Field != "" {
			field += "." + typ.Field
		}
		return &FieldError{Field: field, Reason: "not a JSON value for " + typ.Type.String(), Err: err}
	}
	reason := "invalid value"
	if _, ok := errors.AsType[*time.ParseError](err); ok {
		reason = "not an RFC 3339 time"
	}
	// An UnmarshalJSON or UnmarshalText method failed and did not say
	// where: decode each top-level field alone to find it.
	var fields map[string]json.RawMessage
	if json.Unmarshal(data, &fields) == nil {
		for _, name := range slices.Sorted(maps.Keys(fields)) {
			one, merr := json.Marshal(map[string]json.RawMessage{name: fields[name]})
			var probe T
			if merr == nil && json.Unmarshal(one, &probe) != nil {
				return &FieldError{Field: "data." + name, Reason: reason, Err: err}
			}
		}
	}
	return &FieldError{Field: "data", Reason: reason, Err: err}
}

// jsonName returns the name of a struct field in JSON, for the validator's
// errors; empty (the Go name) when the field has no name in its json tag.
func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "-" {
		return ""
	}
	return name
}

// hasValidateTags reports whether t is a struct (or pointer to one) with a
// `validate` tag on any field, nested structs included.
func hasValidateTags(t reflect.Type) bool {
	seen := map[reflect.Type]bool{}
	var walk func(reflect.Type) bool
	walk = func(t reflect.Type) bool {
		for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice || t.Kind() == reflect.Array || t.Kind() == reflect.Map {
			t = t.Elem()
		}
		if t.Kind() != reflect.Struct || seen[t] {
			return false
		}
		seen[t] = true
		for i := range t.NumField() {
			f := t.Field(i)
			if _, ok := f.Tag.Lookup("validate"); ok || walk(f.Type) {
				return true
			}
		}
		return false
	}
	return walk(t)
}
