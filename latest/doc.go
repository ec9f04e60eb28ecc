// Package latest keeps a handler's own rows at the newest state of their
// subject when events arrive out of order: apply-if-newer.
//
// The processed mark makes each event take effect once, but it only
// recognises the same event again. Events of one subject still arrive out
// of order: a redelivery after a newer event, a replay of a dead letter,
// parallel consumers, batches that run again. A projection whose rows hold
// the latest state of something (an appointment's status) must not let a
// distinct event carrying older state overwrite newer state. The events'
// subject sequence (CloudEvents subject and extension subjectseq) orders
// them; this package compares it.
//
// # A projection
//
// Build a Table once, with the handler, from the names of the table and
// its columns; Upsert writes a row in the attempt's transaction and
// reports whether the event's state was newer:
//
//	view, err := latest.New(latest.Config{
//		Table:   "appointment_view",
//		Key:     []string{"appointment_id"},
//		Version: "seq",
//		Columns: []string{"status"},
//	})
//	...
//	func (p *Projection) Handle(ctx context.Context, ev framework.Event[ChangedV1]) error {
//		_, err := p.view.Upsert(ctx, framework.Conn(ctx, p.db), latest.Row{
//			Key:    []any{ev.Data.AppointmentID},
//			Stamp:  latest.StampOf(ev.Attributes),
//			Values: []any{ev.Data.Status},
//		})
//		return err
//	}
//
// Upsert runs one statement, the same on PostgreSQL and SQLite (3.24 or
// later), with the values as bind parameters:
//
//	INSERT INTO "appointment_view" ("appointment_id", "seq", "status") VALUES (?, ?, ?)
//	ON CONFLICT ("appointment_id") DO UPDATE SET "seq" = excluded."seq", "status" = excluded."status"
//	WHERE excluded."seq" > "appointment_view"."seq"
//
// The key columns must be the table's primary key or a unique index, and
// the version column an integer NOT NULL. Key the table by the subject:
// sequences order the events of one subject only.
//
// # What is newer
//
// A stamp is newer when its sequence is greater than the stored one. An
// equal sequence is not newer: a second event carrying sequence 9 changes
// nothing, so an event's state should be the whole state at its sequence.
// The event's time is never compared: CloudEvents time is optional, and
// producers' clocks disagree. An event without a subject or subjectseq
// cannot be ordered: Upsert refuses it with a permanent error of code
// CodeUnsequenced, so it is dead-lettered instead of being applied in no
// order or dropped in silence. A handler whose events may lack a sequence
// decides for itself before it calls Upsert. Stamp.Newer compares two
// stamps in Go, for state that is not in a table.
//
// # Against the consumer's skip_stale setting
//
// The consumer's skip_stale setting skips, by the same sequence, every
// event at or below the newest of its subject that took effect in the
// consumer: the handler does not run. Upsert decides per row, inside the
// handler: the event is processed (its other writes take effect), and only
// a row whose stored state is as new or newer keeps it. The two work
// together; Upsert alone needs no checkpoint table.
package latest
