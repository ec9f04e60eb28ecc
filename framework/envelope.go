package framework

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"slices"
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

// ErrNotFound is returned by stores for a missing record.
var ErrNotFound = errors.New("not found")

// ErrNotPending is returned by stores when a dead letter to resolve is no
// longer pending: replayed or discarded already.
var ErrNotPending = errors.New("not pending")

// ErrSequenceTaken is returned by Store.Park, ParkGap and EndWait for an
// event whose subject's sequence number another event, with another id,
// holds: parked, a dead letter its subject waits behind, or a discarded
// one the sequence skips. Two events claimed one step of the subject; the
// second is dead-lettered (CodeSequenceConflict).
var ErrSequenceTaken = errors.New("another event holds the subject's sequence number")

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

// BodyKey is the key of a message whose body carries no readable source
// and id: an empty source and "sha256:" with the body's hex digest.
func BodyKey(body []byte) Key {
	sum := sha256.Sum256(body)
	return Key{ID: "sha256:" + hex.EncodeToString(sum[:])}
}

// KeyOfBody returns the key of a message body that Decode refused: its
// source and id when the body is a JSON object holding each once, as a
// String that passes Key.Validate (the source as Decode reads it, a URI
// reference); else BodyKey(body). The key of such a message never depends
// on an attribute that a store cannot hold.
func KeyOfBody(body []byte) Key {
	if !json.Valid(body) {
		return BodyKey(body)
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
		return BodyKey(body)
	}
	idText, idProblem := unquote(id)
	sourceText, sourceProblem := unquote(source)
	if idProblem != "" || sourceProblem != "" {
		return BodyKey(body)
	}
	k := Key{Source: types.ParseURIRef(sourceText).String(), ID: idText}
	if k.Validate() != nil {
		return BodyKey(body)
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

// Decode parses a CloudEvents 1.0 structured JSON object. Every error it
// returns is permanent: CodeTooLarge when body exceeds maxBody bytes (zero
// means DefaultMaxBodyBytes) or an attribute its limit, else
// CodeMalformedEnvelope. Each wraps a FieldError that names the attribute,
// never its value.
//
// Decode holds every transport to the same rules, read from the JSON text
// itself: every attribute name is lower-case ASCII letters and digits, as
// CloudEvents requires (the SDK would fold other names to lower case, or
// stop reading at an empty one); each attribute appears once;
// eventversion is a JSON integer (no fraction, no exponent, not a string)
// from 1 to 2^31-1; subjectseq a string holding a decimal integer >= 1;
// and every attribute whose value is a JSON string (id, source, type,
// subject, correlationid, traceparent, tracestate, datacontenttype,
// dataschema, time, any other extension) holds only characters that
// CloudEvents allows in a String: valid UTF-8, no control character
// (U+0000–U+001F, U+007F–U+009F), no surrogate outside an escaped pair,
// no noncharacter. U+FFFD itself is allowed; a byte that is not UTF-8 and
// a lone surrogate escape, which encoding/json would silently turn into
// U+FFFD, are not. So every attribute a store keeps is one it can hold. A
// time must fall within the years 0000 to 9999 in UTC, and data given as
// data_base64 must be a JSON value, so that Encode writes back what Decode
// read.
//
// An event as Encode writes it, and as producers usually do (no attribute
// but those the framework reads, names written without escapes), is read
// from its text alone, with two allocations: checked as JSON, then
// scanned once. Any other body goes through the CloudEvents SDK, with the
// same result.
func Decode(body []byte, maxBody int) (Envelope, error) {
	if err := CheckBodySize(body, maxBody); err != nil {
		return Envelope{}, err
	}
	if env, ok := decodePlain(body); ok {
		return env, nil
	}
	return decodeSDK(body)
}

// CheckBodySize returns Decode's permanent CodeTooLarge error of a body
// over maxBody bytes (zero means DefaultMaxBodyBytes), nil for one within:
// a producer checks with it what its consumers will take.
func CheckBodySize(body []byte, maxBody int) error {
	if maxBody <= 0 {
		maxBody = DefaultMaxBodyBytes
	}
	if len(body) > maxBody {
		return Permanent(CodeTooLarge, &FieldError{Field: "body", Reason: fmt.Sprintf("is %d bytes, at most %d allowed", len(body), maxBody)})
	}
	return nil
}

// decodeSDK is Decode of a body within its size limit by the CloudEvents
// SDK, then by the JSON text: the reference that decodePlain follows, and
// the decoder of every body decodePlain leaves to it, those it refuses
// included.
func decodeSDK(body []byte) (env Envelope, err error) {
	if err := checkData(body); err != nil {
		return Envelope{}, err
	}
	// The SDK's reader has panicked on a body (a number as data_base64):
	// whatever else it may panic on is a malformed envelope, not a crash
	// of the caller.
	defer func() {
		if p := recover(); p != nil {
			env, err = Envelope{}, Permanent(CodeMalformedEnvelope, &FieldError{Field: "body", Reason: "not a CloudEvents 1.0 JSON object the CloudEvents SDK can read"})
		}
	}()
	ev := cloudevents.New()
	if err := json.Unmarshal(body, &ev); err != nil {
		if json.Valid(body) {
			if _, aerr := checkAttributes(body); aerr != nil {
				return Envelope{}, aerr // names the attribute that the SDK may not
			}
		}
		return Envelope{}, Permanent(CodeMalformedEnvelope, fmt.Errorf("decode cloudevent: %w", unreadable(body, err)))
	}
	if ev.SpecVersion() != cloudevents.CloudEventsVersionV1 {
		return Envelope{}, malformed("specversion", "want 1.0")
	}
	// The SDK reads 1.5 as version 1 and turns what is not UTF-8 into
	// U+FFFD: read the text (valid JSON, as Unmarshal checked).
	version, err := checkAttributes(body)
	if err != nil {
		return Envelope{}, err
	}
	if version == 0 {
		return Envelope{}, malformed(extVersion, "missing")
	}
	env = Envelope{Attributes: Attributes{
		ID:      ev.ID(),
		Source:  ev.Source(),
		Type:    ev.Type(),
		Version: version,
		Time:    ev.Time(),
		Subject: ev.Subject(),
	}}
	// Limits first: the SDK's validation would call an oversized id merely
	// malformed.
	if err := env.Key().checkSize(); err != nil && CodeOf(err) == CodeTooLarge {
		return Envelope{}, err
	}
	if err := ev.Validate(); err != nil {
		return Envelope{}, Permanent(CodeMalformedEnvelope, fmt.Errorf("invalid cloudevent: %w", invalid(err)))
	}
	if ct := ev.DataContentType(); ct != "" && ct != cloudevents.ApplicationJSON && ct != "text/json" {
		return Envelope{}, malformed("datacontenttype", "want application/json")
	}
	ext := ev.Extensions()
	if s, ok := ext[extSubjectSeq]; ok {
		str, err := types.ToString(s)
		if err != nil {
			return Envelope{}, malformed(extSubjectSeq, "not a string")
		}
		seq, ok := parseSubjectSeq(str)
		if !ok {
			return Envelope{}, malformed(extSubjectSeq, "not a decimal integer >= 1 without leading zeros")
		}
		env.SubjectSeq = seq
	}
	for name, dst := range map[string]*string{
		extCorrelationID: &env.CorrelationID,
		extTraceParent:   &env.TraceParent,
		extTraceState:    &env.TraceState,
	} {
		if s, ok := ext[name]; ok {
			str, err := types.ToString(s)
			if err != nil {
				return Envelope{}, malformed(name, "not a string")
			}
			*dst = str
		}
	}
	if err := env.Validate(); err != nil {
		return Envelope{}, err
	}
	env.Data = ev.Data()
	if ev.DataBase64 && !json.Valid(env.Data) {
		// data_base64 may hold any bytes; the data must be JSON, as
		// datacontenttype says.
		return Envelope{}, malformed("data_base64", "not a JSON value")
	}
	return env, nil
}

// checkData checks how body gives its data, when body is valid JSON: as
// data or as data_base64, not both, and data_base64 as a JSON string (or
// null), which is all the CloudEvents SDK reads it as.
func checkData(body []byte) error {
	if !json.Valid(body) {
		return nil // the SDK's error says what is wrong
	}
	var data, base64 bool
	var err error
	eachMember(body, func(name, value []byte) bool {
		switch string(name) {
		case "data":
			data = true
		case "data_base64":
			base64 = true
			if value[0] != '"' && string(value) != "null" {
				err = malformed("data_base64", "not a string")
			}
		}
		if data && base64 {
			err = malformed("data_base64", "given beside data")
		}
		return err == nil
	})
	return err
}

// checkAttributes checks the attributes of body, valid JSON, as written
// (see Decode): body is an object, each name is valid (memberNameValid)
// and appears once, each JSON string but data is a valid String, and
// eventversion, when present, is an integer in range, which it returns (0
// when absent).
func checkAttributes(body []byte) (version int, err error) {
	var buf [32][]byte // an event's few attribute names, without allocation
	names := buf[:0]
	ok := eachMember(body, func(name, value []byte) bool {
		names = append(names, name)
		switch {
		case !memberNameValid(name):
			// The CloudEvents SDK reads such names its own way: it folds
			// an extension's name to lower case (keeping the last of
			// "subjectseq" and "SubjectSeq"), and ends the object at an
			// empty name, dropping the data and attributes after it.
			err = malformed("body", "an attribute name is not lower-case letters and digits")
		case string(name) == extVersion:
			version, err = parseVersion(value)
		case string(name) == "data":
		case len(value) > 0 && value[0] == '"':
			if problem := decodeString(value, nil); problem != "" {
				err = malformed(fieldName(name), problem)
			}
		}
		return err == nil
	})
	switch {
	case !ok:
		return 0, malformed("body", "not a JSON object whose attribute names are valid strings")
	case err != nil:
		return 0, err
	}
	if name := repeated(names); name != nil {
		return 0, malformed(fieldName(name), "appears more than once")
	}
	return version, nil
}

// repeated returns a name that names holds more than once, or nil. It
// sorts names when they are many.
func repeated(names [][]byte) []byte {
	if len(names) <= 32 {
		for i := range names {
			for j := range i {
				if bytes.Equal(names[i], names[j]) {
					return names[i]
				}
			}
		}
		return nil
	}
	slices.SortFunc(names, bytes.Compare)
	for i := 1; i < len(names); i++ {
		if bytes.Equal(names[i-1], names[i]) {
			return names[i]
		}
	}
	return nil
}

// memberNameValid reports whether name may name a member of a structured
// CloudEvent: an attribute's name, one or more lower-case ASCII letters
// and digits as CloudEvents requires, or data_base64.
func memberNameValid(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') {
			return string(name) == "data_base64"
		}
	}
	return true
}

// fieldName returns name as the field of a FieldError: as it is when it is
// an attribute name, else "body" (an error never quotes what it cannot
// vouch for).
func fieldName(name []byte) string {
	if attributeName(string(name)) {
		return string(name)
	}
	return "body"
}

// parseVersion reads eventversion as written: a JSON integer, without
// fraction or exponent, from 1 to 2^31-1.
func parseVersion(raw []byte) (int, error) {
	digits := raw
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || slices.ContainsFunc(digits, func(c byte) bool { return c < '0' || c > '9' }) {
		return 0, malformed(extVersion, "not an integer")
	}
	v, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil || v < 1 || v > maxVersion {
		return 0, malformed(extVersion, "out of range 1..2^31-1")
	}
	return int(v), nil
}

// unreadable names the attribute of body that the CloudEvents SDK could not
// read (err), without its value: the SDK's errors quote the value, some a
// stretch of the body.
func unreadable(body []byte, err error) *FieldError {
	var attrs map[string]json.RawMessage
	if json.Unmarshal(body, &attrs) != nil || attrs == nil {
		return &FieldError{Field: "body", Reason: "not a JSON object", Err: err}
	}
	if _, ok := attrs["specversion"]; !ok {
		return &FieldError{Field: "specversion", Reason: "missing", Err: err}
	}
	for _, name := range slices.Sorted(maps.Keys(attrs)) {
		if !attributeName(name) {
			return &FieldError{Field: "body", Reason: "an attribute name is not ASCII letters and digits", Err: err}
		}
		one, merr := json.Marshal(map[string]json.RawMessage{
			"specversion": json.RawMessage(`"1.0"`), "id": json.RawMessage(`"x"`),
			"source": json.RawMessage(`"x"`), "type": json.RawMessage(`"x"`),
			name: attrs[name],
		})
		if merr != nil {
			continue
		}
		ev := cloudevents.New()
		if json.Unmarshal(one, &ev) != nil {
			return &FieldError{Field: name, Reason: "invalid value", Err: err}
		}
	}
	return &FieldError{Field: "body", Reason: "not a CloudEvents 1.0 JSON object", Err: err}
}

// attributeName reports whether the SDK reads name as an attribute name:
// ASCII letters and digits, or data_base64.
func attributeName(name string) bool {
	if name == "data_base64" {
		return true
	}
	if name == "" {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; (c < 'a' || c > 'z') && (c < 'A' || c > 'Z') && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// invalid turns the SDK's validation error into a FieldError of the first
// invalid attribute.
func invalid(err error) *FieldError {
	var v cloudevents.ValidationError
	if errors.As(err, &v) && len(v) > 0 {
		return &FieldError{Field: slices.Sorted(maps.Keys(v))[0], Reason: "breaks CloudEvents 1.0", Err: err}
	}
	return &FieldError{Field: "body", Reason: "not a valid CloudEvent", Err: err}
}

// parseSubjectSeq reads a subjectseq: a decimal integer of at least 1
// that fits an int64, in ASCII digits alone (no sign, no spaces) and
// without leading zeros, so that a sequence has one spelling ("01" would
// be 1 to one reader and text to another). Decode and the plain decoder
// both read it here.
func parseSubjectSeq(s string) (int64, bool) {
	if s == "" || s[0] < '1' || s[0] > '9' {
		return 0, false
	}
	for i := 1; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	seq, err := strconv.ParseInt(s, 10, 64)
	return seq, err == nil
}
