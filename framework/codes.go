package framework

// Code names why a message was dead-lettered. Codes are short snake_case
// words; they are stored and shown instead of an error's text, which may
// quote payload data. A handler may use codes of its own (see Permanent).
type Code string

// The framework's codes. Every code the framework writes is listed here.
const (
	// CodeMalformedEnvelope: the body is not a CloudEvents 1.0 JSON object
	// with id, source, type and eventversion, or an attribute is invalid.
	CodeMalformedEnvelope Code = "malformed_envelope"
	// CodeTooLarge: the body, the id, the source, the type or the subject
	// exceeds its limit; or a replayed message does not fit the
	// transport (on RabbitMQ, its headers over one frame).
	CodeTooLarge Code = "too_large"
	// CodeUnknownType: no handler of the consumer handles the event type.
	CodeUnknownType Code = "unknown_type"
	// CodeUnsupportedVersion: the consumer handles the type, not this version.
	CodeUnsupportedVersion Code = "unsupported_version"
	// CodeInvalidPayload: the data does not decode into the payload type or
	// fails its validation.
	CodeInvalidPayload Code = "invalid_payload"
	// CodeHandlerFailed: the handler returned a permanent error without a
	// code of its own.
	CodeHandlerFailed Code = "handler_failed"
	// CodeDataException: the database refused a value of the handler's
	// statement, an error of SQLSTATE class 22 (PostgreSQL: text holding
	// NUL, a string too long for its column, a number out of range, a
	// malformed date or uuid): the same message would fail the same way,
	// so it is not retried.
	CodeDataException Code = "data_exception"
	// CodeRetriesExhausted: every attempt failed with a retryable error.
	CodeRetriesExhausted Code = "retries_exhausted"
	// CodeTimeout: the last attempt ran out of its time limit.
	CodeTimeout Code = "timeout"
	// CodePanic: the last attempt panicked, or decoding the data did (a
	// payload's Validate, an upcast), which is not retried.
	CodePanic Code = "panic"
	// CodeDeliveryLimit: the message was delivered more often than the
	// consumer's delivery limit, typically because it crashes the process.
	CodeDeliveryLimit Code = "delivery_limit"
	// CodeSequenceGap: the sequence guard gave up waiting for a missing
	// earlier event of the same subject.
	CodeSequenceGap Code = "sequence_gap"
	// CodeSequenceConflict: under strict order, another event of the
	// same subject, with another id, holds the event's sequence number,
	// parked, a dead letter or skipped (see ErrSequenceTaken): two events
	// claimed one step, and the first keeps it. The dead letter does not
	// hold the subject; once the other event took effect, a replay of it
	// is skipped as stale.
	CodeSequenceConflict Code = "sequence_conflict"
	// CodeUnreadableMessage: the transport could not read the message as
	// it was stored (a row whose metadata is not a JSON object of
	// strings); the dead letter keeps the body and the stored metadata.
	CodeUnreadableMessage Code = "unreadable_message"
)

// Valid reports whether c is a well-formed code: 1 to 64 bytes of
// lower-case letters, digits and underscores, starting with a letter.
func (c Code) Valid() bool {
	if len(c) == 0 || len(c) > 64 || c[0] < 'a' || c[0] > 'z' {
		return false
	}
	for i := 0; i < len(c); i++ {
		ch := c[i]
		if (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '_' {
			return false
		}
	}
	return true
}
