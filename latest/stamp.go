package latest

import (
	"context"

	"github.com/effectively-once/effectively/framework"
)

// CodeUnsequenced is the dead-letter code of an event that apply-if-newer
// cannot order: it carries no subject or no subjectseq. Retrying cannot
// add them, so the error is permanent.
const CodeUnsequenced framework.Code = "unsequenced"

// Stamp is the version of one subject's state: the subject (the aggregate
// id, CloudEvents subject) and its sequence (extension subjectseq). Only
// stamps of one subject are ordered, by their sequence.
type Stamp struct {
	// Subject is the aggregate id, e.g. an appointment's id.
	Subject string
	// Seq is the subject's sequence, 1 or more; zero when the event has
	// none.
	Seq int64
}

// StampOf returns the stamp of an event: its subject and subject sequence.
// A handler passes its event's attributes:
//
//	stamp := latest.StampOf(ev.Attributes)
func StampOf(attrs framework.Attributes) Stamp {
	return Stamp{Subject: attrs.Subject, Seq: attrs.SubjectSeq}
}

// FromContext returns the stamp of the event whose message ctx is handling
// in the consumer chain (see framework.EnvelopeFromContext), for code that
// a handler calls with its context alone. It is false outside the chain,
// e.g. under driver.Consume, which hands the handler its event only.
func FromContext(ctx context.Context) (Stamp, bool) {
	env, ok := framework.EnvelopeFromContext(ctx)
	if !ok {
		return Stamp{}, false
	}
	return StampOf(env.Attributes), true
}

// Validate reports a stamp that cannot be ordered: one without a subject
// or without a sequence (Seq below 1). Its error is permanent, with code
// CodeUnsequenced, and names the attribute (subject or subjectseq), never
// a value.
func (s Stamp) Validate() error {
	switch {
	case s.Subject == "":
		return unsequenced("subject", "missing: apply-if-newer orders the events of one subject")
	case s.Seq < 1:
		return unsequenced("subjectseq", "missing or below 1: apply-if-newer orders events by their subject sequence")
	}
	return nil
}

func unsequenced(field, reason string) error {
	return framework.Permanent(CodeUnsequenced, &framework.FieldError{Field: field, Reason: reason})
}

// Newer reports whether s is newer than stored, the stamp of the state
// already applied: both of one subject and s.Seq greater than stored.Seq.
// An equal sequence is not newer (a redelivery, or another event carrying
// the same state). A zero stored stamp means nothing is stored yet: every
// valid s is newer. A stamp that Validate refuses (no subject, no
// sequence) is never newer, nor is a stamp of another subject, whose
// sequence says nothing about this one's. The event's time is never
// compared: CloudEvents time is optional, and clocks disagree.
func (s Stamp) Newer(stored Stamp) bool {
	if s.Validate() != nil {
		return false
	}
	if stored == (Stamp{}) {
		return true
	}
	return s.Subject == stored.Subject && s.Seq > stored.Seq
}
