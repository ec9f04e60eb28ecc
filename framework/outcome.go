package framework

// Outcome says what became of a delivery: the unit of work's Do and
// Consume return Processed, Duplicate or Failed; the consumer chain
// reports every outcome, and its metrics carry the outcome's text as a
// label.
type Outcome string

// The outcomes of a delivery.
const (
	// Processed: the handler ran and its effect committed.
	Processed Outcome = "processed"
	// Duplicate: the event had been processed, or its dead letter
	// discarded; the handler did not run.
	Duplicate Outcome = "duplicate"
	// Stale: a newer event of the subject had taken effect (skip_stale);
	// the handler did not run.
	Stale Outcome = "stale"
	// Parked: the event waits, acked and not processed, behind an earlier
	// event of its subject that is a dead letter, or that has not arrived
	// (strict order); it is applied once that one takes effect or is
	// discarded.
	Parked Outcome = "parked"
	// DeadLettered: the message was stored as a dead letter and acked.
	DeadLettered Outcome = "dead_lettered"
	// Nacked: the message was handed back to the transport, to be
	// delivered again.
	Nacked Outcome = "nacked"
	// Failed: the attempt rolled back; the event is not processed.
	Failed Outcome = "failed"
)
