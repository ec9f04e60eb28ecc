package driver

import (
	"context"
	"time"

	"github.com/effectively-once/effectively/framework"
)

// Inspector is what an operator's views read of a store besides Store:
// everything the database knows of one event, and figures per consumer.
// sqlite.Store, postgres.Store and memory.Store implement it; the suite of
// package storetest holds each to the same behaviour. It reads only.
type Inspector interface {
	// InspectEvent returns what the store knows of the event key: its
	// outbox row, the consumers' processed marks, its dead letters with
	// their history, its holds and parkings, and how far the purges have
	// removed such evidence. A key the store knows nothing of gives a
	// record whose Known is false, not an error.
	InspectEvent(ctx context.Context, key framework.Key) (EventRecord, error)
	// InspectConsumers returns, per consumer that has any, the marks
	// processed at or after since, the pending dead letters and the
	// parked events, and the outbox's unsent rows.
	InspectConsumers(ctx context.Context, since time.Time) (ConsumersRecord, error)
}

// PurgeKind names what a purge deletes, whose horizon the store records
// (see PurgeHorizons).
type PurgeKind string

// The purges that record how far they deleted.
const (
	// PurgeProcessed is the purge of old processed marks
	// (Store.PurgeProcessed): by the time they were processed.
	PurgeProcessed PurgeKind = "processed"
	// PurgeOutbox is the purge of sent outbox rows (a service's purge, or
	// a relay's cleanup): by the time they were sent.
	PurgeOutbox PurgeKind = "outbox"
)

// PurgeHorizons says how far the purges have deleted: each kind's rows
// older than its time may be gone. A zero time means that kind was never
// purged.
type PurgeHorizons struct {
	// Processed: marks processed before it may be gone.
	Processed time.Time
	// Outbox: outbox rows sent before it may be gone.
	Outbox time.Time
	// DeadLetters: dead letters resolved before it may be gone, with
	// their history (pending ones are never purged).
	DeadLetters time.Time
}

// EventRecord is everything a store knows of one event.
type EventRecord struct {
	Key framework.Key
	// Outbox is the producer's outbox row of the event; nil when there is
	// none (another service produced it, it was never produced, or its
	// row was purged once sent: see Horizons.Outbox).
	Outbox *OutboxRecord
	// Processed are the consumers' processed marks of the event, by
	// consumer: the consumers that applied it.
	Processed []ProcessedMark
	// DeadLetters are the event's dead letters, one per consumer that gave
	// up on it, by ID, each with its history.
	DeadLetters []DeadLetterRecord
	// Parked are the event's holds (a dead letter that later events of
	// its subject wait behind, Held) and parkings (it waits behind one),
	// by consumer.
	Parked []ParkedEvent
	// Horizons say how far the purges have deleted.
	Horizons PurgeHorizons
}

// Known reports whether the store holds any record of the event.
func (r EventRecord) Known() bool {
	return r.Outbox != nil || len(r.Processed) > 0 || len(r.DeadLetters) > 0 || len(r.Parked) > 0
}

// OutboxRecord is an event's row in the producer's outbox.
type OutboxRecord struct {
	// ID orders the outbox's rows.
	ID         int64
	Type       string
	Subject    string
	SubjectSeq int64
	// CreatedAt is when the producer's transaction added it.
	CreatedAt time.Time
	// SentAt is when the relay published it; zero while unsent.
	SentAt time.Time
}

// ProcessedMark is a consumer's record that it applied an event.
type ProcessedMark struct {
	Consumer string
	// At is when the attempt that applied the event made the mark.
	At time.Time
}

// DeadLetterRecord is a dead letter with its history, oldest first.
type DeadLetterRecord struct {
	DeadLetter
	History []HistoryEntry
}

// ConsumersRecord holds the figures of the consumers and of the outbox.
type ConsumersRecord struct {
	// Consumers are the figures of each consumer that has any, by name.
	Consumers []ConsumerFigures
	// Unsent counts the outbox's unsent rows; OldestUnsent is when the
	// oldest of them was added (zero when none is).
	Unsent       int64
	OldestUnsent time.Time
}

// ConsumerFigures are one consumer's figures in a ConsumersRecord.
type ConsumerFigures struct {
	Consumer string
	// Processed counts the marks made at or after the time asked for.
	Processed int64
	// PendingDeadLetters counts its dead letters waiting for an operator.
	PendingDeadLetters int64
	// Parked counts its events parked behind a dead letter.
	Parked int64
}
