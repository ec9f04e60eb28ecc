package framework_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// FuzzDecode feeds Decode any body. It never panics; it either refuses the
// body permanently with malformed_envelope or too_large and a FieldError,
// keying it by attributes every store can hold, or returns an envelope
// that passes Validate, encodes, and decodes again to itself. The seed
// corpus holds every body of the bad-input catalog.
func FuzzDecode(f *testing.F) {
	seeds := map[string][]any{}
	for _, in := range transporttest.Catalog("notes.note.added") {
		seeds["catalog-"+in.Name] = []any{in.Body}
	}
	testenv.SeedCorpus(f, seeds)
	f.Add(fuzzEvent(f))
	// White space around attributes, which the CloudEvents SDK's setters
	// trim and Decode keeps (a source it reads in its URI-reference form).
	for _, body := range []string{
		`{"specversion":"1.0","id":" 1 ","source":" notes ","type":" notes.note.added ","subject":" s","eventversion":1,"data":{}}`,
		`{"specversion":"1.0","id":"1","source":"/é b?c d#e f","type":"t","eventversion":1,"data":{},"x":"y"}`,
	} {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		env, err := framework.Decode(body, 0)
		if err != nil {
			requireRefused(t, body, err)
			return
		}
		requireRoundTrip(t, env)
	})
}

// fuzzEvent returns the body of a valid event with every attribute set.
func fuzzEvent(tb testing.TB) []byte {
	tb.Helper()
	body, err := framework.Encode(framework.Envelope{
		Attributes: framework.Attributes{
			ID: "1", Source: "notes", Type: "notes.note.added", Version: 1,
			Subject: "s-1", SubjectSeq: 3, CorrelationID: "c", TraceState: "k=v",
			TraceParent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		},
		Data: json.RawMessage(`{"text":"hello"}`),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return body
}

func requireRefused(t *testing.T, body []byte, err error) {
	t.Helper()
	if !framework.IsPermanent(err) {
		t.Fatalf("Decode refused the body with an error that is not permanent: %v", err)
	}
	if code := framework.CodeOf(err); code != framework.CodeMalformedEnvelope && code != framework.CodeTooLarge {
		t.Fatalf("Decode refused the body with code %s: %v", code, err)
	}
	var fe *framework.FieldError
	if !errors.As(err, &fe) || fe.Field == "" {
		t.Fatalf("Decode's error names no field: %v", err)
	}
	key := framework.BodyKey(body)
	if key != framework.DigestKey(body) {
		if kerr := key.Validate(); kerr != nil {
			t.Fatalf("the refused body's key %q is one a store may not hold: %v", key, kerr)
		}
	}
}

func requireRoundTrip(t *testing.T, env framework.Envelope) {
	t.Helper()
	if err := env.Validate(); err != nil {
		t.Fatalf("Decode returned an envelope that Validate refuses: %v", err)
	}
	if len(env.Data) > 0 && !json.Valid(env.Data) {
		t.Fatalf("Decode returned data that is not JSON: %q", env.Data)
	}
	body, err := framework.Encode(env)
	if err != nil {
		t.Fatalf("Decode returned an envelope that Encode refuses: %v", err)
	}
	again, err := framework.Decode(body, 0)
	if err != nil {
		t.Fatalf("the encoded envelope does not decode: %v\n%s", err, body)
	}
	if !again.Time.Equal(env.Time) {
		t.Fatalf("time %v came back as %v", env.Time, again.Time)
	}
	if !bytes.Equal(compact(t, again.Data), compact(t, env.Data)) {
		t.Fatalf("data %q came back as %q", env.Data, again.Data)
	}
	again.Time = env.Time
	again.Data, env.Data = nil, nil
	if again.Attributes != env.Attributes {
		t.Fatalf("attributes %+v came back as %+v", env.Attributes, again.Attributes)
	}
}

// compact returns data without insignificant space, "null" when empty.
func compact(t *testing.T, data json.RawMessage) []byte {
	t.Helper()
	if len(strings.TrimSpace(string(data))) == 0 {
		return []byte("null")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, data); err != nil {
		t.Fatalf("data is not JSON: %v", err)
	}
	return b.Bytes()
}
