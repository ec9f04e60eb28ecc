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

// secret stands for personal data in a payload: no decode or validation
// error may quote it.
const secret = "sk_live_4242SECRET"

type appointmentV1 struct {
	ID       string    `json:"appointmentId" validate:"required"`
	StartsAt time.Time `json:"startsAt"`
	Seats    int       `json:"seats" validate:"max=8"`
	Patient  struct {
		Email string `json:"email" validate:"omitempty,email"`
	} `json:"patient"`
}

var appointmentBooked = framework.Define[appointmentV1]("appointments.appointment.appointmentBooked", 1)

// contactV1 validates itself; its Validate names the field when it can.
type contactV1 struct {
	Phone string `json:"phone"`
	Email string `json:"email"`
}

func (c contactV1) Validate() error {
	if strings.HasPrefix(c.Phone, "sk_") {
		return fmt.Errorf("phone %q looks like a key", c.Phone) // a careless text
	}
	if strings.HasPrefix(c.Email, "sk_") {
		return &framework.FieldError{Field: "email", Reason: "not an e-mail address", Err: fmt.Errorf("%q", c.Email)}
	}
	return nil
}

var contacted = framework.Define[contactV1]("contacts.contact.added", 1)

// TestDecodeErrorsNameTheFieldNotTheValue: every decode and validation
// error says which attribute or data field is wrong, with a code, and never
// quotes the value (the errors of encoding/json, time and the CloudEvents
// SDK do).
func TestDecodeErrorsNameTheFieldNotTheValue(t *testing.T) {
	t.Parallel()
	envelope := func(m map[string]any) []byte {
		full := map[string]any{"specversion": "1.0", "id": "e1", "source": "appointments", "type": appointmentBooked.Type(), "eventversion": 1}
		for k, v := range m {
			full[k] = v
		}
		b, err := json.Marshal(full)
		require.NoError(t, err)
		return b
	}
	tests := []struct {
		name  string
		body  []byte
		def   func(framework.Envelope) error
		code  framework.Code
		field string
	}{
		{"Time", envelope(map[string]any{"time": "tomorrow " + secret}), nil, framework.CodeMalformedEnvelope, "time"},
		{"ExtensionNotString", envelope(map[string]any{"correlationid": map[string]any{"x": secret}}), nil, framework.CodeMalformedEnvelope, "correlationid"},
		{"IDNotString", envelope(map[string]any{"id": []string{secret}}), nil, framework.CodeMalformedEnvelope, "id"},
		{"SpecVersion", envelope(map[string]any{"specversion": secret}), nil, framework.CodeMalformedEnvelope, "specversion"},
		{"SubjectSeq", envelope(map[string]any{"subjectseq": secret}), nil, framework.CodeMalformedEnvelope, "subjectseq"},
		{"ContentType", envelope(map[string]any{"datacontenttype": secret + "/x"}), nil, framework.CodeMalformedEnvelope, "datacontenttype"},
		{"Base64", envelope(map[string]any{"data_base64": secret + "!"}), nil, framework.CodeMalformedEnvelope, "data_base64"},
		{"NotJSON", []byte(`{"id": "` + secret), nil, framework.CodeMalformedEnvelope, "body"},
		{"DataTime", envelope(map[string]any{"data": map[string]any{"appointmentId": "a", "startsAt": "tomorrow " + secret}}), decodeAppointment, framework.CodeInvalidPayload, "data.startsAt"},
		{"DataType", envelope(map[string]any{"data": map[string]any{"appointmentId": "a", "seats": secret}}), decodeAppointment, framework.CodeInvalidPayload, "data.seats"},
		{"DataTag", envelope(map[string]any{"data": map[string]any{"appointmentId": "a", "patient": map[string]any{"email": secret}}}), decodeAppointment, framework.CodeInvalidPayload, "data.patient.email"},
		{"DataRequired", envelope(map[string]any{"data": map[string]any{"seats": 99}}), decodeAppointment, framework.CodeInvalidPayload, "data.appointmentId"},
		{"DataSyntax", []byte(`{"specversion":"1.0","id":"e1","source":"s","type":"t","eventversion":1,"data":"` + secret + `"}`), decodeAppointment, framework.CodeInvalidPayload, "data"},
		{"ValidateMethod", envelope(map[string]any{"type": contacted.Type(), "data": map[string]any{"phone": secret}}), decodeContact, framework.CodeInvalidPayload, "data"},
		{"ValidateMethodNamesField", envelope(map[string]any{"type": contacted.Type(), "data": map[string]any{"email": secret}}), decodeContact, framework.CodeInvalidPayload, "data.email"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			env, err := framework.Decode(tt.body, 0)
			if tt.def != nil {
				require.NoError(t, err)
				err = tt.def(env)
			}
			require.Error(t, err)
			require.Equal(t, tt.code, framework.CodeOf(err), "%v", err)
			fe, ok := errors.AsType[*framework.FieldError](err)
			require.True(t, ok, "%v wraps a FieldError", err)
			require.Equal(t, tt.field, fe.Field)
			require.NotContains(t, err.Error(), secret)
			require.NotContains(t, err.Error(), "tomorrow")
			require.NotContains(t, fmt.Sprintf("%+v", err), secret)
			require.Contains(t, err.Error(), tt.field+": ")
		})
	}
}

func decodeAppointment(env framework.Envelope) error {
	env.Type = appointmentBooked.Type()
	_, err := appointmentBooked.Decode(env)
	return err
}

func decodeContact(env framework.Envelope) error {
	_, err := contacted.Decode(env)
	return err
}

// TestFieldErrorKeepsItsCause: the cause, value and all, stays reachable
// for code that asks for it; it is only left out of the text.
func TestFieldErrorKeepsItsCause(t *testing.T) {
	t.Parallel()
	env, err := appointmentBooked.Envelope(appointmentV1{ID: "a"}, framework.Attributes{Source: "appointments"})
	require.NoError(t, err)
	env.Data = json.RawMessage(`{"appointmentId":"a","startsAt":"tomorrow"}`)
	_, err = appointmentBooked.Decode(env)
	var parse *time.ParseError
	require.ErrorAs(t, err, &parse)
	require.Equal(t, "tomorrow", parse.Value)
}
