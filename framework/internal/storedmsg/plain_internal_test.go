package storedmsg

import (
	"bytes"
	"maps"
	"testing"
	"unicode/utf8"
)

// FuzzPlainMetadata: whatever text the one-scan reading of plain
// metadata takes, encoding/json reads the same, key for key.
func FuzzPlainMetadata(f *testing.F) {
	for _, seed := range []string{
		`{}`, ` { } `, `{"content-type":"application/cloudevents+json"}`,
		`{"a":"1","b":"2"}`, `{"a":"1","a":"2"}`, "{\"a\":\"x\ty\"}", `{"a":"\u00e9"}`,
		`{"a":null}`, `{"a":1}`, `{"a":"1",}`, `{"a" "1"}`, `{"a":"1"} x`, `["a"]`, `{"é":"ü"}`,
		"{\n\t\"k\" :\r\n \"v\" \n}", `{"a":"1"}}`, `{"`, `{"a":"b\"c"}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, text []byte) {
		text = bytes.TrimSpace(text)
		if !utf8.Valid(text) {
			return
		}
		plain, ok := plainMetadata(text)
		if !ok {
			return
		}
		viaJSON, reason := jsonMetadata(text)
		if reason != "" {
			t.Fatalf("%q: read in one scan as %q, encoding/json refuses it: %s", text, plain, reason)
		}
		if !maps.Equal(plain, viaJSON) {
			t.Fatalf("%q: one scan %q, encoding/json %q", text, plain, viaJSON)
		}
	})
}

// TestPlainMetadataTakesTheUsual: the metadata the transports write, and
// an INSERT by hand, are read in one scan; escapes and nulls are left to
// encoding/json.
func TestPlainMetadataTakesTheUsual(t *testing.T) {
	for text, want := range map[string]bool{
		`{"content-type":"application/cloudevents+json"}`:                         true,
		`{"content-type": "application/cloudevents+json", "traceparent": "00-1"}`: true,
		`{}`:                 true,
		`{"a":"b\"c"}`:       false,
		`{"a":"\u00e9"}`:     false,
		`{"a":null}`:         false,
		`{"a":1}`:            false,
		`{"a":"1",}`:         false,
		`{"a":"1"} trailing`: false,
	} {
		if _, ok := plainMetadata([]byte(text)); ok != want {
			t.Errorf("plainMetadata(%s): ok %v, want %v", text, ok, want)
		}
	}
}
