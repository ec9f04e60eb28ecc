package framework_test

import (
	"encoding/json"
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
		{"NotJSONData", valid(func(m map[string]any) { m["datacontenttype"] = "text/plain" }), 0, framework.CodeMalformedEnvelope},
		{"LongID", valid(func(m map[string]any) { m["id"] = strings.Repeat("i", framework.MaxIDBytes+1) }), 0, framework.CodeTooLarge},
		{"LongSource", valid(func(m map[string]any) { m["source"] = strings.Repeat("s", framework.MaxSourceBytes+1) }), 0, framework.CodeTooLarge},
		{"LargeBody", valid(func(map[string]any) {}), 10, framework.CodeTooLarge},
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
