package framework

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"time"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
)

// Limits of an envelope's attributes and body, and of a consumer's name.
const (
	// MaxIDBytes is the longest event id.
	MaxIDBytes = 256
	// MaxSourceBytes is the longest source.
	MaxSourceBytes = 512
	// MaxSubjectBytes is the longest subject. The subject keys the
	// checkpoints and parked events of strict_order and skip_stale, and
	// PostgreSQL refuses a key over about 2.7 kB in an index: a longer
	// subject could be neither applied nor held there.
	MaxSubjectBytes = 1024
	// MaxTypeBytes is the longest event type. The type names the topic an
	// event is published to, and RabbitMQ takes no exchange name longer
	// than 255 bytes.
	MaxTypeBytes = 255
	// DefaultMaxBodyBytes is the default limit of a message body.
	DefaultMaxBodyBytes = 1 << 20
	// MaxConsumerNameBytes is the longest consumer name.
	MaxConsumerNameBytes = 120
)

// The CloudEvents extension attributes the framework reads and writes.
const (
	extVersion       = "eventversion"
	extSubjectSeq    = "subjectseq"
	extCorrelationID = "correlationid"
	extTraceParent   = "traceparent"
	extTraceState    = "tracestate"
)

// Key identifies an event, as CloudEvents says: source and id together.
type Key struct {
	Source string
	ID     string
}

// String returns the key as "source/id".
func (k Key) String() string { return k.Source + "/" + k.ID }

// Validate reports the first part of k that Decode refuses: an id or
// source that is missing, over its limit (MaxIDBytes, MaxSourceBytes), or
// holds a character that CloudEvents forbids in a String (see Decode), or
// a source that is not a URI reference. Its errors are Decode's: permanent,
// CodeTooLarge or CodeMalformedEnvelope, naming the attribute, never its
// value. A key that passes can be stored by every store.
func (k Key) Validate() error {
	if err := k.checkSize(); err != nil {
		return err
	}
	if err := checkString("id", k.ID); err != nil {
		return err
	}
	if err := checkString("source", k.Source); err != nil {
		return err
	}
	if plainPath(k.Source) {
		return nil // a URI reference, and the usual source: spare the parse
	}
	if _, err := url.Parse(k.Source); err != nil {
		return Permanent(CodeMalformedEnvelope, &FieldError{Field: "source", Reason: "not a URI reference", Err: err})
	}
	return nil
}

// checkSize reports a missing id or source, or one over its limit.
func (k Key) checkSize() error {
	switch {
	case k.ID == "":
		return malformed("id", "missing")
	case len(k.ID) > MaxIDBytes:
		return Permanent(CodeTooLarge, &FieldError{Field: "id", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(k.ID), MaxIDBytes)})
	case k.Source == "":
		return malformed("source", "missing")
	case len(k.Source) > MaxSourceBytes:
		return Permanent(CodeTooLarge, &FieldError{Field: "source", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(k.Source), MaxSourceBytes)})
	}
	return nil
}

// DigestKey is the key of a message by its body alone: an empty source
// and "sha256:" with the body's hex digest. It keys the dead letter of a
// message whose body carries no readable source and id (see BodyKey),
// and of one whose key is a dead letter's already with another body
// (driver.Store.PublishDeadLetter), so that no failed body overwrites
// another.
func DigestKey(body []byte) Key {
	sum := sha256.Sum256(body)
	return Key{ID: "sha256:" + hex.EncodeToString(sum[:])}
}

// BodyKey returns the key of a message body that Decode refused: its
// source and id when the body is a JSON object holding each once, as a
// String that passes Key.Validate (the source as Decode reads it, a URI
// reference); else an empty source and "sha256:" with the body's hex
// digest. The key of such a message never depends on an attribute that a
// store cannot hold.
func BodyKey(body []byte) Key {
	if !json.Valid(body) {
		return DigestKey(body)
	}
	var id, source []byte
	repeated := false
	ok := eachMember(body, func(name, value []byte) bool {
		switch string(name) {
		case "id":
			repeated = repeated || id != nil
			id = value
		case "source":
			repeated = repeated || source != nil
			source = value
		}
		return true
	})
	if !ok || repeated {
		return DigestKey(body)
	}
	idText, idProblem := unquote(id)
	sourceText, sourceProblem := unquote(source)
	if idProblem != "" || sourceProblem != "" {
		return DigestKey(body)
	}
	k := Key{Source: types.ParseURIRef(sourceText).String(), ID: idText}
	if k.Validate() != nil {
		return DigestKey(body)
	}
	return k
}

// Attributes are an event's CloudEvents context attributes: everything but
// the data.
type Attributes struct {
	// ID is generated once by the producer; at most MaxIDBytes bytes.
	ID string
	// Source is the producing context, e.g. "appointments"; at most
	// MaxSourceBytes bytes. Source and ID identify the event.
	Source string
	// Type names the event, e.g. "appointments.appointment.booked". It
	// carries no version.
	Type string
	// Version is the data's contract version, 1 or more (extension
	// eventversion).
	Version int
	// Time is when the event happened; zero when unknown.
	Time time.Time
	// Subject is the aggregate id, the ordering key; empty when none; at
	// most MaxSubjectBytes bytes.
	Subject string
	// SubjectSeq is the subject's monotonic sequence, 1 or more; zero when
	// none (extension subjectseq, a decimal string on the wire).
	SubjectSeq int64
	// CorrelationID ties related events together (extension correlationid).
	CorrelationID string
	// TraceParent and TraceState carry W3C trace context.
	TraceParent string
	TraceState  string
}

// Key returns the event's key.
func (a Attributes) Key() Key { return Key{Source: a.Source, ID: a.ID} }

// Validate reports the first attribute that breaks the wire contract: the
// key (see Key.Validate), a missing type, a type over MaxTypeBytes or a
// subject over MaxSubjectBytes (CodeTooLarge), an id, type or subject of
// only white space, a version out of
// 1..2^31-1, a negative subject sequence, or a string attribute holding a
// character that CloudEvents forbids in a String (see Decode).
func (a Attributes) Validate() error {
	if err := a.Key().Validate(); err != nil {
		return err
	}
	switch {
	case a.Type == "":
		return malformed("type", "missing")
	case blank(a.ID):
		return malformed("id", "only white space")
	case blank(a.Type):
		return malformed("type", "only white space")
	case a.Subject != "" && blank(a.Subject):
		return malformed("subject", "only white space")
	case len(a.Type) > MaxTypeBytes:
		return Permanent(CodeTooLarge, &FieldError{Field: "type", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(a.Type), MaxTypeBytes)})
	case len(a.Subject) > MaxSubjectBytes:
		return Permanent(CodeTooLarge, &FieldError{Field: "subject", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(a.Subject), MaxSubjectBytes)})
	case a.Version < 1 || a.Version > maxVersion:
		return malformed(extVersion, "out of range 1..2^31-1")
	case a.SubjectSeq < 0:
		return malformed(extSubjectSeq, "negative")
	case !a.Time.IsZero() && (a.Time.UTC().Year() < 0 || a.Time.UTC().Year() > 9999):
		// Encode writes the time in UTC, where RFC 3339 has four digits.
		return malformed("time", "outside the years 0000 to 9999 in UTC")
	}
	for _, attr := range []struct{ name, value string }{
		{"type", a.Type},
		{"subject", a.Subject},
		{extCorrelationID, a.CorrelationID},
		{extTraceParent, a.TraceParent},
		{extTraceState, a.TraceState},
	} {
		if err := checkString(attr.name, attr.value); err != nil {
			return err
		}
	}
	return nil
}

// blank reports whether s is only white space, which CloudEvents (and so
// Decode) refuses for an id, a type or a subject.
func blank(s string) bool { return strings.TrimSpace(s) == "" }

// maxVersion is the greatest event version: CloudEvents integers are
// 32-bit.
const maxVersion = 1<<31 - 1

// Envelope is an event whose data is still encoded JSON: what travels on a
// transport, one CloudEvents 1.0 JSON object.
type Envelope struct {
	Attributes
	// Data is the payload, a JSON value.
	Data json.RawMessage
}

// Encode returns the envelope as a CloudEvents 1.0 structured JSON object.
func Encode(env Envelope) ([]byte, error) {
	if err := env.Validate(); err != nil {
		return nil, err
	}
	ev := cloudevents.New(cloudevents.CloudEventsVersionV1)
	// The id, the type and the subject as they are: the SDK's setters
	// trim white space around them, which Decode keeps, so that an event
	// sent as " a" arrived as "a" (a follow-up of subject " a" in another
	// subject, an outbox row's event id not the one consumers mark).
	ctx, ok := ev.Context.(*cloudevents.EventContextV1)
	if !ok {
		return nil, fmt.Errorf("encode event %s: the CloudEvents SDK's context is a %T", env.Key(), ev.Context)
	}
	ctx.ID, ctx.Type = env.ID, env.Type
	if env.Subject != "" {
		subject := env.Subject
		ctx.Subject = &subject
	}
	ev.SetSource(env.Source) // in its URI-reference form, as Decode reads it
	if !env.Time.IsZero() {
		ev.SetTime(env.Time)
	}
	ev.SetExtension(extVersion, int32(env.Version)) //nolint:gosec // validated above
	if env.SubjectSeq > 0 {
		ev.SetExtension(extSubjectSeq, strconv.FormatInt(env.SubjectSeq, 10))
	}
	for name, v := range map[string]string{
		extCorrelationID: env.CorrelationID,
		extTraceParent:   env.TraceParent,
		extTraceState:    env.TraceState,
	} {
		if v != "" {
			ev.SetExtension(name, v)
		}
	}
	data := env.Data
	if len(data) == 0 {
		data = json.RawMessage("null")
	}
	ev.SetDataContentType(cloudevents.ApplicationJSON)
	ev.DataEncoded = data // already JSON: written as "data", not base64
	body, err := json.Marshal(ev)
	if err != nil {
		return nil, fmt.Errorf("encode event %s: %w", env.Key(), err)
	}
	return body, nil
}

// malformed returns the permanent CodeMalformedEnvelope error of an
// attribute, named without its value.
func malformed(field, reason string) error {
	return Permanent(CodeMalformedEnvelope, &FieldError{Field: field, Reason: reason})
}
