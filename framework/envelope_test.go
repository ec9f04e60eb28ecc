package framework_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

func TestEncodeDecode(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 11, 30, 9, 30, 0, 123456789, time.UTC)
	env := framework.Envelope{
		Attributes: framework.Attributes{
			ID: "evt-1", Source: "appointments", Type: "appointments.appointment.booked", Version: 2,
			Time: at, Subject: "appt-7", SubjectSeq: 3, CorrelationID: "corr-9",
			TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", TraceState: "k=v",
		},
		Data: json.RawMessage(`{"appointmentId":"appt-7"}`),
	}
	body, err := framework.Encode(env)
	require.NoError(t, err)

	var wire map[string]any
	require.NoError(t, json.Unmarshal(body, &wire))
	require.Equal(t, "1.0", wire["specversion"])
	require.Equal(t, "evt-1", wire["id"])
	require.Equal(t, "appointments", wire["source"])
	require.Equal(t, "appointments.appointment.booked", wire["type"])
	require.EqualValues(t, 2, wire["eventversion"], "eventversion is a JSON integer")
	require.Equal(t, "3", wire["subjectseq"], "subjectseq is a decimal string")
	require.Equal(t, "corr-9", wire["correlationid"])
	require.Equal(t, "appt-7", wire["subject"])
	require.Equal(t, map[string]any{"appointmentId": "appt-7"}, wire["data"], "data is the JSON object itself")
	require.NotContains(t, wire, "data_base64")

	got, err := framework.Decode(body, 0)
	require.NoError(t, err)
	require.True(t, got.Time.Equal(at))
	got.Time = at
	require.JSONEq(t, string(env.Data), string(got.Data))
	got.Data = env.Data
	require.Equal(t, env, got)
}

func TestDecodeForeignProducer(t *testing.T) {
	t.Parallel()
	// What a producer in another language would publish.
	body := `{"specversion":"1.0","id":"42","source":"https://example.com/appointments","type":"appointments.appointment.booked",
		"eventversion":1,"time":"2026-11-30T09:30:00Z","datacontenttype":"application/json","data":{"appointmentId":"a"}}`
	env, err := framework.Decode([]byte(body), 0)
	require.NoError(t, err)
	require.Equal(t, framework.Key{Source: "https://example.com/appointments", ID: "42"}, env.Key())
	require.Equal(t, 1, env.Version)
	require.JSONEq(t, `{"appointmentId":"a"}`, string(env.Data))
}

func TestDecodePoison(t *testing.T) {
	t.Parallel()
	valid := func(mutate func(m map[string]any)) string {
		m := map[string]any{"specversion": "1.0", "id": "1", "source": "s", "type": "t", "eventversion": 1, "data": map[string]any{}}
		mutate(m)
		b, err := json.Marshal(m)
		require.NoError(t, err)
		return string(b)
	}
	tests := []struct {
		name string
		body string
		max  int
		code framework.Code
	}{
		{"NotJSON", "not json", 0, framework.CodeMalformedEnvelope},
		{"JSONArray", "[1,2]", 0, framework.CodeMalformedEnvelope},
		{"NoID", valid(func(m map[string]any) { delete(m, "id") }), 0, framework.CodeMalformedEnvelope},
		{"NoSource", valid(func(m map[string]any) { delete(m, "source") }), 0, framework.CodeMalformedEnvelope},
		{"NoType", valid(func(m map[string]any) { delete(m, "type") }), 0, framework.CodeMalformedEnvelope},
		{"NoVersion", valid(func(m map[string]any) { delete(m, "eventversion") }), 0, framework.CodeMalformedEnvelope},
		{"VersionString", valid(func(m map[string]any) { m["eventversion"] = "1" }), 0, framework.CodeMalformedEnvelope},
		{"VersionZero", valid(func(m map[string]any) { m["eventversion"] = 0 }), 0, framework.CodeMalformedEnvelope},
		{"WrongSpecVersion", valid(func(m map[string]any) { m["specversion"] = "0.3" }), 0, framework.CodeMalformedEnvelope},
		{"BadSubjectSeq", valid(func(m map[string]any) { m["subjectseq"] = "x" }), 0, framework.CodeMalformedEnvelope},
		{"SubjectSeqZero", valid(func(m map[string]any) { m["subjectseq"] = "0" }), 0, framework.CodeMalformedEnvelope},
		{"SubjectSeqLeadingZero", valid(func(m map[string]any) { m["subjectseq"] = "007" }), 0, framework.CodeMalformedEnvelope},
		{"SubjectSeqSigned", valid(func(m map[string]any) { m["subjectseq"] = "+5" }), 0, framework.CodeMalformedEnvelope},
		{"SubjectSeqSpaced", valid(func(m map[string]any) { m["subjectseq"] = " 5" }), 0, framework.CodeMalformedEnvelope},
		{"SubjectSeqNumber", valid(func(m map[string]any) { m["subjectseq"] = 5 }), 0, framework.CodeMalformedEnvelope},
		{"NotJSONData", valid(func(m map[string]any) { m["datacontenttype"] = "text/plain" }), 0, framework.CodeMalformedEnvelope},
		{"LongID", valid(func(m map[string]any) { m["id"] = strings.Repeat("i", framework.MaxIDBytes+1) }), 0, framework.CodeTooLarge},
		{"LongSource", valid(func(m map[string]any) { m["source"] = strings.Repeat("s", framework.MaxSourceBytes+1) }), 0, framework.CodeTooLarge},
		{"LongSubject", valid(func(m map[string]any) { m["subject"] = strings.Repeat("s", framework.MaxSubjectBytes+1) }), 0, framework.CodeTooLarge},
		{"LargeBody", valid(func(map[string]any) {}), 10, framework.CodeTooLarge},
		{"LongType", valid(func(m map[string]any) { m["type"] = strings.Repeat("t", framework.MaxTypeBytes+1) }), 0, framework.CodeTooLarge},
		// The CloudEvents SDK's reader panicked on a number as data_base64.
		{"Base64Number", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data_base64":5}`, 0, framework.CodeMalformedEnvelope},
		{"Base64Zero", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data_base64":0}`, 0, framework.CodeMalformedEnvelope},
		{"Base64Object", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data_base64":{}}`, 0, framework.CodeMalformedEnvelope},
		{"DataThenBase64", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"data_base64":"e30="}`, 0, framework.CodeMalformedEnvelope},
		{"Base64ThenData", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data_base64":"e30=","data":{}}`, 0, framework.CodeMalformedEnvelope},
		// The CloudEvents SDK's reader ends the object at an empty name:
		// the data, subject and sequence after it were silently dropped.
		{"EmptyNameBeforeData", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"":0,"data":{"text":"x"}}`, 0, framework.CodeMalformedEnvelope},
		{"EmptyNameBeforeSubject", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"":"","subject":"s","subjectseq":"2"}`, 0, framework.CodeMalformedEnvelope},
		// The SDK folds extension names to lower case and keeps the last
		// of two spellings: "subjectseq" then "SubjectSeq" read as 2.
		{"SubjectSeqTwoCases", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"subject":"s","subjectseq":"1","SubjectSeq":"2"}`, 0, framework.CodeMalformedEnvelope},
		{"EventVersionTwoCases", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"EVENTVERSION":2,"data":{}}`, 0, framework.CodeMalformedEnvelope},
		{"TwoCasesAmongMany", manyAttributes(40, `"CorrelationId":"a","correlationid":"b"`), 0, framework.CodeMalformedEnvelope},
		// CloudEvents names are lower-case letters and digits: alone, the
		// SDK read "SubjectSeq" as the sequence but "EventVersion" as an
		// unknown extension.
		{"UpperCaseSubjectSeq", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"subject":"s","SubjectSeq":"5"}`, 0, framework.CodeMalformedEnvelope},
		{"UpperCaseEventVersion", `{"specversion":"1.0","id":"1","source":"s","type":"t","EventVersion":1,"data":{}}`, 0, framework.CodeMalformedEnvelope},
		{"UnderscoreExtension", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"my_ext":"x"}`, 0, framework.CodeMalformedEnvelope},
		{"HyphenExtension", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"my-ext":"x"}`, 0, framework.CodeMalformedEnvelope},
		{"NonASCIIExtension", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"ext\u00e9":"x"}`, 0, framework.CodeMalformedEnvelope},
		{"EscapedUpperCase", `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{},"\u0053ubject":"x"}`, 0, framework.CodeMalformedEnvelope},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := framework.Decode([]byte(tt.body), tt.max)
			require.Error(t, err)
			require.True(t, framework.IsPermanent(err))
			require.Equal(t, tt.code, framework.CodeOf(err))
		})
	}
}

func TestMaxIDAccepted(t *testing.T) {
	t.Parallel()
	env := framework.Envelope{Attributes: framework.Attributes{ID: strings.Repeat("i", framework.MaxIDBytes), Source: "s", Type: "t", Version: 1}, Data: json.RawMessage(`{}`)}
	body, err := framework.Encode(env)
	require.NoError(t, err)
	_, err = framework.Decode(body, 0)
	require.NoError(t, err)
}

// attributeBody returns a valid event as JSON text whose attribute name
// holds the raw JSON text value (quotes included) instead; every
// attribute the tests vary is set.
func attributeBody(name, value string) []byte {
	attrs := [][2]string{
		{"specversion", `"1.0"`},
		{"id", `"e1"`},
		{"source", `"appointments"`},
		{"type", `"appointments.appointment.booked"`},
		{"eventversion", `1`},
		{"subject", `"appt-7"`},
		{"subjectseq", `"3"`},
		{"time", `"2026-11-30T09:30:00Z"`},
		{"correlationid", `"corr-9"`},
		{"traceparent", `"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"`},
		{"tracestate", `"k=v"`},
		{"datacontenttype", `"application/json"`},
		{"dataschema", `"https://example.com/schema"`},
		{"comexampleother", `"x"`},
		{"data", `{"text":"hello"}`},
	}
	var b strings.Builder
	b.WriteString("{")
	for i, a := range attrs {
		if i > 0 {
			b.WriteString(",")
		}
		v := a[1]
		if a[0] == name {
			v = value
		}
		b.WriteString(`"` + a[0] + `":` + v)
	}
	b.WriteString("}")
	return []byte(b.String())
}

// stringAttributes are the attributes of attributeBody whose values are
// CloudEvents Strings.
var stringAttributes = []string{
	"id", "source", "type", "subject", "time", "correlationid", "traceparent",
	"tracestate", "datacontenttype", "dataschema", "comexampleother", "specversion",
}

// TestDecodeRefusesForbiddenCharacters: every String attribute, on every
// transport alike, holds only what CloudEvents allows: no control
// character, no surrogate outside a pair, no noncharacter, nothing that
// is not UTF-8, whether written raw or escaped. The error names the
// attribute and never quotes the value.
func TestDecodeRefusesForbiddenCharacters(t *testing.T) {
	t.Parallel()
	forbidden := []struct {
		name string
		text string // inside the JSON string, as written
	}{
		{"EscapedNUL", `\u0000`},
		{"EscapedUnitSeparator", `\u001f`},
		{"EscapedNewline", `\n`},
		{"EscapedDEL", `\u007f`},
		{"EscapedC1", `\u0085`},
		{"RawDEL", "\x7f"},
		{"RawC1", "\u0085"},
		{"RawInvalidByte", "\xff"},
		{"RawTruncatedSequence", "\xc3"},
		{"RawEncodedSurrogate", "\xed\xa0\x80"},
		{"RawOverlongSlash", "\xc0\xaf"},
		{"EscapedLoneHighSurrogate", `\ud800`},
		{"EscapedLoneLowSurrogate", `\udc00`},
		{"EscapedHighSurrogateThenLetter", `\ud800\u0041`},
		{"EscapedReversedPair", `\ude00\ud83d`},
		{"EscapedNoncharacter", `\ufffe`},
		{"EscapedNoncharacterFDD0", `\ufdd0`},
		{"RawNoncharacter", "\uffff"},
		{"EscapedPlaneNoncharacter", `\ud83f\udffe`},
	}
	for _, attr := range stringAttributes {
		for _, f := range forbidden {
			t.Run(attr+"/"+f.name, func(t *testing.T) {
				t.Parallel()
				body := attributeBody(attr, `"`+secret+f.text+`"`)
				_, err := framework.Decode(body, 0)
				require.Error(t, err)
				require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "%v", err)
				fe, ok := errors.AsType[*framework.FieldError](err)
				require.True(t, ok, "%v wraps a FieldError", err)
				require.Equal(t, attr, fe.Field)
				require.NotContains(t, err.Error(), secret)
			})
		}
	}
}

// TestDecodeAcceptsAllowedCharacters: a surrogate pair, characters beyond
// ASCII and the replacement character U+FFFD itself are ordinary
// characters.
func TestDecodeAcceptsAllowedCharacters(t *testing.T) {
	t.Parallel()
	allowed := []struct {
		name string
		text string // inside the JSON string, as written
		want string
	}{
		{"EscapedPair", `\ud83d\ude00`, "😀"},
		{"RawAstral", "😀", "😀"},
		{"EscapedReplacement", `\ufffd`, "\uFFFD"},
		{"RawReplacement", "\uFFFD", "\uFFFD"},
		{"Latin", `caf\u00e9 é`, "café é"},
		{"Escapes", `a\/b\"c\\d`, `a/b"c\d`},
		{"Tab", `a b`, "a b"},
	}
	for _, a := range allowed {
		t.Run(a.name, func(t *testing.T) {
			t.Parallel()
			for attr, get := range map[string]func(framework.Envelope) string{
				"id":            func(e framework.Envelope) string { return e.ID },
				"subject":       func(e framework.Envelope) string { return e.Subject },
				"correlationid": func(e framework.Envelope) string { return e.CorrelationID },
				"type":          func(e framework.Envelope) string { return e.Type },
			} {
				env, err := framework.Decode(attributeBody(attr, `"x`+a.text+`"`), 0)
				require.NoError(t, err, attr)
				require.Equal(t, "x"+a.want, get(env), attr)
			}
		})
	}
}

// TestDecodeEventVersion: eventversion is a JSON integer from 1 to
// 2^31-1, as written: no fraction, no exponent, not a string.
func TestDecodeEventVersion(t *testing.T) {
	t.Parallel()
	for _, v := range []string{"1.5", "1.0", "1e0", "10E-1", "0.1e1", `"1"`, "0", "-1", "-0", "2147483648", "9223372036854775808", "true", "null", "[1]", `{"v":1}`} {
		t.Run("Refuses"+v, func(t *testing.T) {
			t.Parallel()
			_, err := framework.Decode(attributeBody("eventversion", v), 0)
			require.Error(t, err)
			require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "%v", err)
			fe, ok := errors.AsType[*framework.FieldError](err)
			require.True(t, ok, "%v wraps a FieldError", err)
			require.Equal(t, "eventversion", fe.Field)
		})
	}
	for v, want := range map[string]int{"1": 1, "2": 2, "2147483647": 1<<31 - 1} {
		env, err := framework.Decode(attributeBody("eventversion", v), 0)
		require.NoError(t, err, v)
		require.Equal(t, want, env.Version, v)
	}
}

// TestDecodeRefusesRepeatedAttribute: an attribute given twice is
// ambiguous (which id is the key?), so it is malformed.
func TestDecodeRefusesRepeatedAttribute(t *testing.T) {
	t.Parallel()
	for _, attr := range []string{"id", "source", "eventversion", "subject", "correlationid", "data"} {
		body := attributeBody("", "")
		body = append(body[:len(body)-1], []byte(`,"`+attr+`":"x"}`)...)
		_, err := framework.Decode(body, 0)
		require.Error(t, err, attr)
		require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "%s: %v", attr, err)
		fe, ok := errors.AsType[*framework.FieldError](err)
		require.True(t, ok, "%v wraps a FieldError", err)
		require.Equal(t, attr, fe.Field)
	}
}

// TestEncodeRefusesForbiddenCharacters: a producer cannot build what
// consumers refuse.
func TestEncodeRefusesForbiddenCharacters(t *testing.T) {
	t.Parallel()
	for name, set := range map[string]func(a *framework.Attributes, v string){
		"id":            func(a *framework.Attributes, v string) { a.ID = v },
		"source":        func(a *framework.Attributes, v string) { a.Source = v },
		"type":          func(a *framework.Attributes, v string) { a.Type = v },
		"subject":       func(a *framework.Attributes, v string) { a.Subject = v },
		"correlationid": func(a *framework.Attributes, v string) { a.CorrelationID = v },
		"traceparent":   func(a *framework.Attributes, v string) { a.TraceParent = v },
		"tracestate":    func(a *framework.Attributes, v string) { a.TraceState = v },
	} {
		for _, bad := range []string{"a\x00b", "a\xffb", "a\x1fb", "a\u0085b", "a\ufffeb"} {
			env := framework.Envelope{Attributes: framework.Attributes{ID: "e1", Source: "s", Type: "t", Version: 1}, Data: json.RawMessage(`{}`)}
			set(&env.Attributes, bad)
			_, err := framework.Encode(env)
			require.Error(t, err, "%s %q", name, bad)
			require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "%s %q: %v", name, bad, err)
			fe, ok := errors.AsType[*framework.FieldError](err)
			require.True(t, ok, "%v wraps a FieldError", err)
			require.Equal(t, name, fe.Field)
		}
	}
}

// TestBodyKey: a body that did not decode keeps its source and id as key
// only when Decode would accept both; otherwise its key is the hash of
// its bytes.
func TestBodyKey(t *testing.T) {
	t.Parallel()
	usable := [][]byte{
		attributeBody("eventversion", "1.5"),
		attributeBody("time", `"tomorrow"`),
		attributeBody("subject", `"a\u0000b"`),
		[]byte(`{"id":"e1","source":"appointments"}`),
	}
	for _, body := range usable {
		require.Equal(t, framework.Key{Source: "appointments", ID: "e1"}, framework.BodyKey(body), "%s", body)
	}
	hashed := [][]byte{
		[]byte("not json"),
		[]byte(`["e1"]`),
		[]byte(`{"id":"e1"}`),
		[]byte(`{"source":"appointments"}`),
		[]byte(`{"id":1,"source":"appointments"}`),
		[]byte(`{"id":"e1","source":"appointments"`),
		[]byte(`{"id":"e1","source":"appointments"} trailing`),
		[]byte(`{"id":"e1","id":"e2","source":"appointments"}`),
		[]byte(`{"id":"e1","source":"%zz"}`),
		attributeBody("id", `"`+strings.Repeat("i", framework.MaxIDBytes+1)+`"`),
		attributeBody("source", `"`+strings.Repeat("s", framework.MaxSourceBytes+1)+`"`),
	}
	for _, bad := range []string{`\u0000`, "\xff", `\ud800`, `\u001b`, "\u009f"} {
		hashed = append(hashed, attributeBody("id", `"e`+bad+`1"`), attributeBody("source", `"app`+bad+`"`))
	}
	for _, body := range hashed {
		require.Equal(t, framework.DigestKey(body), framework.BodyKey(body), "%q", body)
	}
}

// TestKeyValidate: a key passes when Decode would accept its source and
// id.
func TestKeyValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, framework.Key{Source: "https://example.com/a", ID: "\uFFFDe1"}.Validate())
	for _, k := range []framework.Key{
		{Source: "s"},
		{ID: "e"},
		{Source: "s", ID: "e\x00"},
		{Source: "s\xff", ID: "e"},
		{Source: "%zz", ID: "e"},
		{Source: "s", ID: strings.Repeat("i", framework.MaxIDBytes+1)},
	} {
		require.True(t, framework.IsPermanent(k.Validate()), "%q", k)
	}
}

// TestNormalizeSource: Decode reads a source as a URI reference written
// back, so that the spellings of one are one source, and NormalizeSource
// gives an operator's spelling the form the stores keep.
func TestNormalizeSource(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ written, read string }{
		{"appointments", "appointments"},
		{"/svc/a-b_c.d~e", "/svc/a-b_c.d~e"},
		{"a b", "a%20b"},
		{"a%20b", "a%20b"},
		{"café", "caf%C3%A9"},
		{"HTTP://h/p", "http://h/p"},
		{"urn:example:x", "urn:example:x"},
	} {
		body := fmt.Sprintf(`{"specversion":"1.0","id":"1","source":%q,"type":"t","eventversion":1,"data":{}}`, tt.written)
		env, err := framework.Decode([]byte(body), 0)
		require.NoError(t, err, tt.written)
		require.Equal(t, tt.read, env.Source, tt.written)
		require.Equal(t, tt.read, framework.NormalizeSource(tt.written), tt.written)
		require.Equal(t, tt.read, framework.NormalizeSource(tt.read), "normalized already: %s", tt.written)
	}
	require.Equal(t, "%zz", framework.NormalizeSource("%zz"), "a source that does not parse is kept")
}

// manyAttributes returns a valid event with n extensions besides the
// members extra, enough to make Decode sort the names it compares.
func manyAttributes(n int, extra string) string {
	var b strings.Builder
	b.WriteString(`{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":{}`)
	for i := range n {
		fmt.Fprintf(&b, `,"ext%d":"v"`, i)
	}
	b.WriteString("," + extra + "}")
	return b.String()
}

// TestEncodeWritesAttributesAsGiven: Encode writes the id, the type and
// the subject as they are, white space around them included, as Decode
// reads them: the CloudEvents SDK's setters trimmed them, so an event sent
// with subject " a" arrived in subject "a", and an id of white space only
// was written empty. One of only white space is refused, as Decode refuses
// it.
func TestEncodeWritesAttributesAsGiven(t *testing.T) {
	t.Parallel()
	attrs := framework.Attributes{ID: " x ", Source: "s", Type: " t\u00a0", Version: 1, Subject: " a"}
	body, err := framework.Encode(framework.Envelope{Attributes: attrs, Data: json.RawMessage(`{}`)})
	require.NoError(t, err)
	got, err := framework.Decode(body, 0)
	require.NoError(t, err)
	require.Equal(t, attrs, got.Attributes)

	for _, c := range []struct {
		field string
		attrs framework.Attributes
	}{
		{"id", framework.Attributes{ID: " ", Source: "s", Type: "t", Version: 1}},
		{"type", framework.Attributes{ID: "x", Source: "s", Type: "\u3000", Version: 1}},
		{"subject", framework.Attributes{ID: "x", Source: "s", Type: "t", Version: 1, Subject: "  "}},
	} {
		_, err := framework.Encode(framework.Envelope{Attributes: c.attrs, Data: json.RawMessage(`{}`)})
		require.Equal(t, framework.CodeMalformedEnvelope, framework.CodeOf(err), "%+v: %v", c.attrs, err)
		var fe *framework.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, c.field, fe.Field)
	}
}
