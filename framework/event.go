package framework

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/go-playground/validator/v10"
	"github.com/google/uuid"
)

// Validator is implemented by payloads that check themselves. Definitions
// call Validate when they build and when they decode an event.
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
}

// NewDefinition returns the definition of version of event type typ with
// data of type T. The type must not be empty and the version must be 1 or
// more.
func NewDefinition[T any](typ string, version int) (Definition[T], error) {
	if typ == "" {
		return Definition[T]{}, errors.New("event type is empty")
	}
	if version < 1 || version > 1<<31-1 {
		return Definition[T]{}, fmt.Errorf("event %s: version %d out of range 1..2^31-1", typ, version)
	}
	d := Definition[T]{typ: typ, version: version}
	if t := reflect.TypeFor[T](); (t.Kind() == reflect.Struct || t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct) && hasValidateTags(t) {
		d.validate = validator.New(validator.WithRequiredStructEnabled())
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
	if err := d.check(data); err != nil {
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
// or validate.
func (d Definition[T]) Decode(env Envelope) (Event[T], error) {
	if env.Type != d.typ {
		return Event[T]{}, Permanent(CodeUnknownType, fmt.Errorf("event type %q, want %q", env.Type, d.typ))
	}
	if env.Version != d.version {
		return Event[T]{}, Permanent(CodeUnsupportedVersion, fmt.Errorf("%s version %d, want %d", env.Type, env.Version, d.version))
	}
	var data T
	if err := json.Unmarshal(env.Data, &data); err != nil {
		return Event[T]{}, Permanent(CodeInvalidPayload, fmt.Errorf("decode data of %s: %w", d, err))
	}
	if err := d.check(data); err != nil {
		return Event[T]{}, err
	}
	return Event[T]{Attributes: env.Attributes, Data: data}, nil
}

// check validates data; its errors are permanent with CodeInvalidPayload.
func (d Definition[T]) check(data T) error {
	if v, ok := any(data).(Validator); ok {
		if err := v.Validate(); err != nil {
			return Permanent(CodeInvalidPayload, fmt.Errorf("validate data of %s: %w", d, err))
		}
	} else if v, ok := any(&data).(Validator); ok {
		if err := v.Validate(); err != nil {
			return Permanent(CodeInvalidPayload, fmt.Errorf("validate data of %s: %w", d, err))
		}
	}
	if d.validate != nil {
		if err := d.validate.Struct(data); err != nil {
			return Permanent(CodeInvalidPayload, fmt.Errorf("validate data of %s: %w", d, err))
		}
	}
	return nil
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
