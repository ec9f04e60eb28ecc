package framework

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"

	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/cloudevents/sdk-go/v2/types"
)

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
	if err := checkBodySize(body, maxBody); err != nil {
		return Envelope{}, err
	}
	if env, ok := decodePlain(body); ok {
		return env, nil
	}
	return decodeSDK(body)
}

// checkBodySize returns Decode's permanent CodeTooLarge error of a body
// over maxBody bytes (zero means DefaultMaxBodyBytes), nil for one within.
func checkBodySize(body []byte, maxBody int) error {
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
