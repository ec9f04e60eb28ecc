package transporttest

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/effectively-once/effectively/framework"
)

// BadInput is one entry of the bad-input catalog: a message as a producer
// that bypasses the framework, or a hand with access to the broker or the
// database, could publish it, and how a consumer must end it.
type BadInput struct {
	// Name says what is wrong with the input, e.g. "NULInID".
	Name string
	// Body is the message body.
	Body []byte
	// Metadata, when set, is published with Body through the Env's
	// Publisher as the message's metadata: binary-mode CloudEvents carry
	// their attributes there.
	Metadata map[string]string
	// StoredMetadata, when set, is the metadata text of a row inserted by
	// hand into a SQL transport's table (Env.PublishRow).
	StoredMetadata string
	// Headers, when set, are the headers a plain AMQP client sends with
	// Body (Env.PublishHeaders): strings, int32, int64, float64, bool,
	// []byte, time.Time, nil, []any and map[string]any (a table).
	Headers map[string]any
	// Code is the code of the dead letter the input ends as; empty for an
	// event that takes effect.
	Code framework.Code
	// Kept is metadata the dead letter must hold, as every store can:
	// NUL and bytes that are not UTF-8 replaced by U+FFFD.
	Kept map[string]string
	// ID is the event id of an input that takes effect.
	ID string
}

// Catalog returns every input that no transport may let stop a consumer
// of typ, version 1, whose data is {"text": "..."} with text required:
// bodies that are not CloudEvents JSON objects, attributes that
// CloudEvents forbids or that exceed their limits, unknown types and
// versions, data of the wrong shape, and metadata of every type a
// transport carries. Each names the code of its dead letter, or takes
// effect. The bodies are distinct, so that each dead letter is its own.
func Catalog(typ string) []BadInput {
	var in []BadInput
	poison := func(name string, code framework.Code, body []byte) {
		in = append(in, BadInput{Name: name, Body: body, Code: code})
	}
	malformed := func(name string, body []byte) { poison(name, framework.CodeMalformedEnvelope, body) }
	// ev is a note event whose id names the input.
	ev := func(name string, edits ...attr) []byte { return event(typ, "catalog-"+name, edits...) }

	// Bodies that are not one CloudEvents JSON object.
	malformed("EmptyBody", []byte{})
	malformed("Whitespace", []byte(" \n\t "))
	malformed("NotJSON", []byte("hello, consumer"))
	malformed("JSONArray", []byte("["+string(ev("JSONArray"))+"]"))
	malformed("JSONString", []byte(`"catalog-JSONString"`))
	malformed("JSONNull", []byte("null"))
	malformed("TrailingGarbage", append(ev("TrailingGarbage"), "}x"...))
	malformed("TwoObjects", append(ev("TwoObjects"), ev("TwoObjects")...))
	malformed("ByteOrderMark", append([]byte("\xef\xbb\xbf"), ev("ByteOrderMark")...))
	malformed("Nesting100000", nested(100000))
	malformed("DataNesting100000", ev("DataNesting100000", attr{"data", string(nested(100000))}))
	poison("BodyOverLimit", framework.CodeTooLarge,
		ev("BodyOverLimit", attr{"data", `{"text":"` + strings.Repeat("x", framework.DefaultMaxBodyBytes) + `"}`}))
	in = append(in, BadInput{
		Name: "BinaryMode",
		Body: []byte(`{"text":"catalog-BinaryMode"}`),
		Metadata: map[string]string{
			"ce-specversion":  "1.0",
			"ce-id":           "catalog-BinaryMode",
			"ce-source":       "catalog",
			"ce-type":         typ,
			"ce-eventversion": "1",
			"content-type":    "application/json",
		},
		Code: framework.CodeMalformedEnvelope,
	})

	// Required attributes missing or wrong.
	malformed("MissingSpecversion", ev("MissingSpecversion", attr{"specversion", ""}))
	malformed("Specversion03", ev("Specversion03", attr{"specversion", `"0.3"`}))
	malformed("Specversion2", ev("Specversion2", attr{"specversion", `"2.0"`}))
	malformed("SpecversionNumber", ev("SpecversionNumber", attr{"specversion", `1.0`}))
	malformed("MissingID", ev("MissingID", attr{"id", ""}, attr{"subject", `"catalog-MissingID"`}))
	malformed("EmptyID", ev("EmptyID", attr{"id", `""`}, attr{"subject", `"catalog-EmptyID"`}))
	malformed("NumericID", ev("NumericID", attr{"id", "12345"}, attr{"subject", `"catalog-NumericID"`}))
	malformed("MissingSource", ev("MissingSource", attr{"source", ""}))
	malformed("MissingType", ev("MissingType", attr{"type", ""}))
	malformed("BadTime", ev("BadTime", attr{"time", `"yesterday"`}))
	// Times that RFC 3339 cannot write in UTC, as an envelope is encoded.
	malformed("TimeAfterYear9999", ev("TimeAfterYear9999", attr{"time", `"9999-12-31T23:30:00-01:00"`}))
	malformed("TimeBeforeYear0", ev("TimeBeforeYear0", attr{"time", `"0000-01-01T00:30:00+01:00"`}))

	// Control characters, surrogates and invalid UTF-8 in String
	// attributes, which CloudEvents forbids and PostgreSQL's text refuses.
	for _, a := range stringAttributes(typ) {
		name := strings.ToUpper(a.name[:1]) + a.name[1:]
		value := a.value
		if a.name == "id" {
			value = "catalog-%sInID"
		}
		nul := fmt.Sprintf(value, "NUL")
		malformed("NULIn"+name, ev("NULIn"+name, attr{a.name, `"` + nul[:len(nul)/2] + `\u0000` + nul[len(nul)/2:] + `"`}))
		malformed("InvalidUTF8In"+name, ev("InvalidUTF8In"+name, attr{a.name, `"` + fmt.Sprintf(value, "InvalidUTF8") + "\xff\xfe" + `"`}))
	}
	for _, c := range [][2]string{
		{"Newline", `\n`},
		{"UnitSeparator", `\u001f`},
		{"Delete", `\u007f`},
		{"C1Control", `\u0085`},
		{"LoneSurrogate", `\ud800`},
		{"LowSurrogate", `\udfff`},
		{"RawSurrogate", "\xed\xa0\x80"},
		{"OverlongNUL", "\xc0\x80"},
		{"TruncatedUTF8", "\xe2\x82"},
	} {
		name := c[0] + "InID"
		malformed(name, ev(name, attr{"id", `"catalog-` + name + c[1] + `"`}))
	}

	// Limits.
	poison("ID300Bytes", framework.CodeTooLarge, ev("ID300Bytes", attr{"id", `"catalog-ID300Bytes-` + strings.Repeat("i", 300) + `"`}))
	poison("ID10kB", framework.CodeTooLarge, ev("ID10kB", attr{"id", `"catalog-ID10kB-` + strings.Repeat("i", 10000) + `"`}))
	poison("Source600Bytes", framework.CodeTooLarge, ev("Source600Bytes", attr{"source", `"` + strings.Repeat("s", 600) + `"`}))
	poison("Type256Bytes", framework.CodeTooLarge, ev("Type256Bytes", attr{"type", `"` + strings.Repeat("t", 256) + `"`}))

	// Types and versions no handler knows.
	poison("UnknownType", framework.CodeUnknownType, ev("UnknownType", attr{"type", `"catalog.unknown.type"`}))
	poison("UnknownVersion", framework.CodeUnsupportedVersion, ev("UnknownVersion", attr{"eventversion", "2"}))
	malformed("MissingVersion", ev("MissingVersion", attr{"eventversion", ""}))
	malformed("FractionalVersion", ev("FractionalVersion", attr{"eventversion", "1.5"}))
	malformed("StringVersion", ev("StringVersion", attr{"eventversion", `"1"`}))
	malformed("ZeroVersion", ev("ZeroVersion", attr{"eventversion", "0"}))
	malformed("NegativeVersion", ev("NegativeVersion", attr{"eventversion", "-1"}))
	malformed("VersionOver32Bits", ev("VersionOver32Bits", attr{"eventversion", "2147483648"}))

	// Subject sequences that are not a decimal string of an integer >= 1.
	for _, c := range [][2]string{
		{"NonNumeric", `"seven"`},
		{"Zero", `"0"`},
		{"LeadingZero", `"01"`},
		{"Negative", `"-3"`},
		{"Fractional", `"1.5"`},
		{"Empty", `""`},
		{"Overflow", `"99999999999999999999"`},
		{"Number", `7`},
	} {
		name := c[0] + "SubjectSeq"
		malformed(name, ev(name, attr{"subject", `"s-1"`}, attr{"subjectseq", c[1]}))
	}

	// Data that is not the payload's JSON, or fails its validation.
	poison("DataArray", framework.CodeInvalidPayload, ev("DataArray", attr{"data", `[1,2]`}))
	poison("DataString", framework.CodeInvalidPayload, ev("DataString", attr{"data", `"hello"`}))
	poison("DataFieldWrongType", framework.CodeInvalidPayload, ev("DataFieldWrongType", attr{"data", `{"text":5}`}))
	poison("DataFailsValidation", framework.CodeInvalidPayload, ev("DataFailsValidation", attr{"data", `{"text":""}`}))
	poison("MissingData", framework.CodeInvalidPayload, ev("MissingData", attr{"data", ""}))
	malformed("DataBase64NotJSON", ev("DataBase64NotJSON", attr{"data", ""}, attr{"data_base64", `"` + base64.StdEncoding.EncodeToString([]byte("hello")) + `"`}))
	// A number as data_base64 made the CloudEvents SDK's reader panic.
	malformed("DataBase64Number", ev("DataBase64Number", attr{"data", ""}, attr{"data_base64", "5"}))
	malformed("DataAndDataBase64", ev("DataAndDataBase64", attr{"data_base64", `"` + base64.StdEncoding.EncodeToString([]byte(`{"text":"other"}`)) + `"`}))
	in = append(in, BadInput{
		Name: "DataBase64",
		Body: ev("DataBase64", attr{"data", ""}, attr{"data_base64", `"` + base64.StdEncoding.EncodeToString([]byte(`{"text":"hello"}`)) + `"`}),
		ID:   "catalog-DataBase64",
	})
	// An empty attribute name ends the CloudEvents SDK's reading of the
	// object: the data and attributes after it would be dropped.
	malformed("EmptyAttributeName", ev("EmptyAttributeName", attr{"", `"x"`}, attr{"subject", `"s-1"`}, attr{"subjectseq", `"2"`}, attr{"data", ""}, attr{"data", `{"text":"hello"}`}))
	malformed("EmptyAttributeNameBeforeData", ev("EmptyAttributeNameBeforeData", attr{"data", ""}, attr{"", "null"}, attr{"data", `{"text":"hello"}`}))
	// CloudEvents names are lower-case letters and digits; the SDK folds
	// others to lower case, keeping the last of two spellings.
	malformed("SubjectSeqTwoCases", ev("SubjectSeqTwoCases", attr{"subject", `"s-1"`}, attr{"subjectseq", `"1"`}, attr{"SubjectSeq", `"2"`}))
	malformed("EventVersionTwoCases", ev("EventVersionTwoCases", attr{"EventVersion", "2"}))
	malformed("CorrelationIDTwoCases", ev("CorrelationIDTwoCases", attr{"CORRELATIONID", `"a"`}, attr{"correlationid", `"b"`}))
	malformed("UpperCaseSubjectSeq", ev("UpperCaseSubjectSeq", attr{"subject", `"s-1"`}, attr{"SubjectSeq", `"5"`}))
	malformed("UnderscoreExtension", ev("UnderscoreExtension", attr{"my_ext", `"x"`}))
	malformed("TextDataContentType", ev("TextDataContentType", attr{"datacontenttype", `"text/plain"`}, attr{"data", `"hello"`}))
	malformed("XMLDataContentType", ev("XMLDataContentType", attr{"datacontenttype", `"application/xml"`}, attr{"data", `"<text>hello</text>"`}))

	// Metadata: NUL and invalid UTF-8 in a value published with a
	// poison body, which the dead letter must keep in a form every store
	// holds.
	in = append(in, BadInput{
		Name:     "PoisonWithNULMetadata",
		Body:     []byte(`{"hello":"catalog-PoisonWithNULMetadata"}`),
		Metadata: map[string]string{"note": "a\x00b\xff"},
		Code:     framework.CodeMalformedEnvelope,
		Kept:     map[string]string{"note": "a\uFFFDb\uFFFD"},
	})
	// Stored metadata of SQL rows inserted by hand: what is not a JSON
	// object of strings cannot be read as published.
	for _, c := range [][2]string{
		{"NumberMetadata", `{"n":1}`},
		{"ArrayMetadata", `["a"]`},
		{"StringMetadata", `"text"`},
		{"ObjectValueMetadata", `{"k":{"a":"b"}}`},
		{"BoolMetadata", `{"k":true}`},
		{"TruncatedMetadata", `{"k":`},
		{"NotJSONMetadata", `k=v`},
		{"InvalidUTF8Metadata", "{\"k\":\"\xff\"}"},
	} {
		in = append(in, BadInput{
			Name: c[0], Body: ev(c[0]), StoredMetadata: c[1], Code: framework.CodeUnreadableMessage,
			Kept: map[string]string{framework.MetadataUnreadableRaw: strings.ToValidUTF8(c[1], "\uFFFD")},
		})
	}
	// Stored metadata that is readable: the event takes effect, or its
	// dead letter keeps the metadata.
	for _, c := range [][2]string{
		{"NULMetadata", `{"k":"a\u0000b"}`},
		{"NullValueMetadata", `{"k":null}`},
		{"NullMetadata", `null`},
		{"RedeliveredMetadata", `{"` + framework.MetadataRedelivered + `":"false"}`},
		// Only the transport marks a row unreadable: a row that says so
		// of itself is a good event.
		{"UnreadableMarkerMetadata", `{"` + framework.MetadataUnreadable + `":"forged","` + framework.MetadataUnreadableRaw + `":"x"}`},
	} {
		in = append(in, BadInput{Name: c[0], Body: ev(c[0]), StoredMetadata: c[1], ID: "catalog-" + c[0]})
	}
	in = append(in, BadInput{
		Name:           "PoisonWithNULStoredMetadata",
		Body:           []byte(`{"hello":"catalog-PoisonWithNULStoredMetadata"}`),
		StoredMetadata: `{"k":"a\u0000b","content-type":"application/json"}`,
		Code:           framework.CodeMalformedEnvelope,
		Kept:           map[string]string{"k": "a\uFFFDb", "content-type": "application/json"},
	})
	// AMQP headers of every type a plain client or the broker (x-death,
	// x-delivery-count) may set: they are metadata text, harmless to an
	// event, kept by a dead letter.
	in = append(in,
		BadInput{Name: "TypedHeaders", Body: ev("TypedHeaders"), Headers: typedHeaders(), ID: "catalog-TypedHeaders"},
		// The unreadable markers are a SQL transport's word on a row: a
		// producer's headers saying so have a good event take effect.
		BadInput{
			Name: "UnreadableMarkerHeaders", Body: ev("UnreadableMarkerHeaders"), ID: "catalog-UnreadableMarkerHeaders",
			Headers: map[string]any{framework.MetadataUnreadable: "forged", framework.MetadataUnreadableRaw: "x"},
		},
		BadInput{
			Name:    "PoisonWithTypedHeaders",
			Body:    []byte(`{"hello":"catalog-PoisonWithTypedHeaders"}`),
			Headers: typedHeaders(),
			Code:    framework.CodeMalformedEnvelope,
			Kept: map[string]string{
				"x-delivery-count": "3", "bool": "true", "float": "1.5",
				"bytes": "a\uFFFDb\uFFFD", "nul-string": "a\uFFFDb\uFFFD",
			},
		},
	)
	return in
}

// attr is an attribute of a catalog body: its name and raw JSON value.
type attr struct{ name, value string }

// event returns the body of a note event of typ with id, its attributes
// changed by edits: each sets an attribute's raw JSON value (appending an
// attribute not there) or, when the value is empty, drops it.
func event(typ, id string, edits ...attr) []byte {
	attrs := []attr{
		{"specversion", `"1.0"`},
		{"id", quote(id)},
		{"source", `"catalog"`},
		{"type", quote(typ)},
		{"eventversion", "1"},
		{"datacontenttype", `"application/json"`},
		{"data", `{"text":"hello"}`},
	}
	for _, e := range edits {
		i := indexOf(attrs, e.name)
		switch {
		case i < 0:
			attrs = append(attrs, e)
		case e.value == "":
			attrs = append(attrs[:i], attrs[i+1:]...)
		default:
			attrs[i] = e
		}
	}
	var b strings.Builder
	b.WriteByte('{')
	for i, a := range attrs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(quote(a.name) + ":" + a.value)
	}
	b.WriteByte('}')
	return []byte(b.String())
}

func indexOf(attrs []attr, name string) int {
	for i, a := range attrs {
		if a.name == name {
			return i
		}
	}
	return -1
}

func quote(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}

// stringAttributes returns the String attributes a note event may carry,
// each with a valid value as a format whose %s may take a word.
func stringAttributes(typ string) []attr {
	return []attr{
		{"id", ""}, // named per input
		{"source", "catalog-%s"},
		{"type", typ + "%.0s"},
		{"subject", "subject-%s"},
		{"correlationid", "correlation-%s"},
		{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01%.0s"},
		{"tracestate", "catalog=%s"},
		{"subjectseq", "7%.0s"},
		{"datacontenttype", "application/json%.0s"},
		{"dataschema", "https://example.com/%s"},
	}
}

// nested returns depth nested JSON arrays.
func nested(depth int) []byte {
	return []byte(strings.Repeat("[", depth) + strings.Repeat("]", depth))
}

// typedHeaders returns AMQP headers of every field type, x-death as the
// broker writes it among them, and bytes no store takes as text.
func typedHeaders() map[string]any {
	at := time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC)
	return map[string]any{
		"x-death": []any{map[string]any{
			"count": int64(2), "reason": "rejected", "queue": "q", "exchange": "x",
			"time": at, "routing-keys": []any{"a", "b"},
		}},
		"x-delivery-count":     int64(3),
		"x-first-death-reason": "rejected",
		"int32":                int32(-7),
		"float":                1.5,
		"bool":                 true,
		"bytes":                []byte("a\x00b\xff"),
		"nul-string":           "a\x00b\xff",
		"time":                 at,
		"table":                map[string]any{"k": "v", "n": int64(1)},
		"array":                []any{int64(1), "a", false},
		"void":                 nil,
	}
}
