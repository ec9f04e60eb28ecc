package framework_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// plainBodies are events that Decode reads in one pass (decodePlain),
// without the CloudEvents SDK: what Encode writes and what producers
// usually write, spaces and escapes included.
var plainBodies = map[string]string{
	"Typical": typicalBody,
	"Minimal": `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1}`,
	"Spaced": "\n { \"specversion\" : \"1.0\" ,\t\"id\":\"1\",\"source\":\"s\",\"type\":\"t\"," +
		"\"eventversion\" :\r 7 , \"data\" :  [1, {\"a\": null}]  }\n",
	"DataLast":        `{"data":"x","specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1}`,
	"DataNull":        `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"data":null}`,
	"URISource":       `{"specversion":"1.0","id":"1","source":"https://example.com/a b?q=1#f","type":"t","eventversion":1}`,
	"URNSource":       `{"specversion":"1.0","id":"1","source":"urn:example:appointments","type":"t","eventversion":1}`,
	"PathSource":      `{"specversion":"1.0","id":"1","source":"/appointments/v1_x.y~z","type":"t","eventversion":1}`,
	"EscapedValues":   `{"specversion":"1.0","id":"\u00e9\ud83d\ude00\/","source":"s\"","type":"t\\","eventversion":1}`,
	"Unicode":         `{"specversion":"1.0","id":"é😀","source":"s","type":"t","eventversion":1,"subject":"ü"}`,
	"TimeOffset":      `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"time":"2026-11-30T09:30:00.5+02:00"}`,
	"EmptyTime":       `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"time":""}`,
	"EmptySubject":    `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"subject":""}`,
	"EmptyExtensions": `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":1,"correlationid":"","traceparent":"","tracestate":""}`,
	"TextJSON":        `{"specversion":"1.0","id":"1","source":"s","type":"t","eventversion":2147483647,"datacontenttype":"text/json","data":{}}`,
}

// TestDecodePlainReadsUsualEvents: the usual events, and every event Encode
// writes, are read in one pass over their text, without the CloudEvents
// SDK (which parses the body twice more, with encoding/json and
// json-iterator), to the envelope the SDK reads.
func TestDecodePlainReadsUsualEvents(t *testing.T) {
	t.Parallel()
	bodies := map[string][]byte{"AllAttributes": fuzzEvent(t)}
	for name, body := range plainBodies {
		bodies[name] = []byte(body)
	}
	for name, body := range bodies {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, ok := framework.DecodePlain(body)
			require.True(t, ok, "decodePlain leaves the body to the SDK")
			want, err := framework.DecodeSDK(body)
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

// TestDecodePlainLeavesInvalidJSON: decodePlain checks the object's
// syntax as it scans, and each value as it reads it, instead of
// validating the whole body first: a body that is not JSON, however close
// to a plain event, is left to the SDK, which refuses it.
func TestDecodePlainLeavesInvalidJSON(t *testing.T) {
	t.Parallel()
	const head = `{"specversion":"1.0","id":"1","source":"s","type":"t"`
	for name, body := range map[string]string{
		"LeadingZero":      head + `,"eventversion":01}`,
		"PlusSign":         head + `,"eventversion":+1}`,
		"Fraction":         head + `,"eventversion":1.}`,
		"BareWord":         head + `,"eventversion":1,"data":tru}`,
		"TrailingComma":    head + `,"eventversion":1,}`,
		"NoColon":          head + `,"eventversion" 1}`,
		"TwoValues":        head + `,"eventversion":1 2}`,
		"JunkAfterValue":   head + `,"eventversion":1,"subject":"x"y}`,
		"JunkAfterObject":  head + `,"eventversion":1}x`,
		"SecondObject":     head + `,"eventversion":1}{}`,
		"ExtraBrace":       head + `,"eventversion":1}}`,
		"Unclosed":         head + `,"eventversion":1`,
		"UnclosedData":     head + `,"eventversion":1,"data":{"a":1}`,
		"BadData":          head + `,"eventversion":1,"data":{"a":}}`,
		"DataUnquotedKey":  head + `,"eventversion":1,"data":{a:1}}`,
		"DataControlChar":  head + `,"eventversion":1,"data":"a` + "\x01" + `"}`,
		"DataBadEscape":    head + `,"eventversion":1,"data":"\x"}`,
		"NameNotString":    `{specversion:"1.0","id":"1","source":"s","type":"t","eventversion":1}`,
		"SemicolonBetween": head + `;"eventversion":1}`,
		"ArrayTop":         `[` + head + `,"eventversion":1}]`,
		"NoValue":          head + `,"eventversion":}`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, ok := framework.DecodePlain([]byte(body))
			require.False(t, ok, "decodePlain took a body that is not JSON")
			_, err := framework.DecodeSDK([]byte(body))
			require.Error(t, err)
		})
	}
}

// TestDecodeAllocations pins the cost of decoding a typical event: one
// pass over the text, one copy of it for the attributes and one of the
// data (the SDK took 39 allocations).
func TestDecodeAllocations(t *testing.T) {
	body := []byte(typicalBody)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := framework.Decode(body, 0); err != nil {
			t.Fatal(err)
		}
	})
	require.LessOrEqual(t, allocs, 2.0+raceAllocs)
}

// FuzzDecodePlain feeds decodePlain and the CloudEvents SDK's decoding any
// body: what decodePlain takes, the SDK takes, to the same envelope. So
// Decode reads every body alike, whichever of the two reads it. The seed
// corpus holds every body of the bad-input catalog and the plain events.
func FuzzDecodePlain(f *testing.F) {
	seeds := map[string][]any{}
	for _, in := range transporttest.Catalog("notes.note.added") {
		seeds["catalog-"+in.Name] = []any{in.Body}
	}
	for name, body := range plainBodies {
		seeds["plain-"+name] = []any{[]byte(body)}
	}
	testenv.SeedCorpus(f, seeds)
	f.Add(fuzzEvent(f))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, ok := framework.DecodePlain(body)
		if !ok {
			return
		}
		want, err := framework.DecodeSDK(body)
		if err != nil {
			t.Fatalf("decodePlain took a body that the SDK refuses (%v): %q", err, body)
		}
		require.Equal(t, want, got, "body %q", body)
	})
}
