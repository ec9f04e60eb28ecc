package driver

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// Store is what a consumer needs of its database, and what operators act
// on: the processed marks, the delivery counts, the subjects' checkpoints,
// the events parked behind an earlier event of their subject (strict order),
// the dead letters, the purge of old marks and the adoption of a renamed
// consumer's history. sqlite.Store, postgres.Store and memory.Store
// implement it; the shared suite of package storetest holds each to the
// same behaviour.
//
// The methods that take the attempt's transaction act inside it: they
// commit or roll back with the handler's writes.
type Store interface {
	// Mark records, inside tx, that consumer processed the event key. It
	// returns false when the event was already marked (a duplicate), and
	// when consumer's dead letter of key is discarded, recording nothing:
	// an operator who discards a dead letter settles its event for good,
	// so that a copy of it that comes later (a redelivery, a producer's
	// second publish) is not processed either. When another transaction
	// holds an uncommitted mark of the same key, Mark waits for it to
	// end.
	Mark(ctx context.Context, tx *Tx, consumer string, key framework.Key) (bool, error)

	// Count records one more delivery of key to consumer in a short
	// transaction of its own and returns the number of deliveries seen so
	// far, so that a message that kills the process on every delivery is
	// dead-lettered instead of looping forever. When the row is new it
	// starts at first (2 when the transport reported a redelivery whose
	// first delivery was not counted, else 1).
	//
	// A first of 0 counts no delivery: it records a message that the
	// service hands back unhandled (a stop, a rebalance), whose delivery
	// the transport vouched was a first one, which cost nothing. A key
	// without a count gets one at zero, so that its redelivery, flagged
	// by the transport, counts as the first; a count stays as it is.
	// Only the guard's own counts (1 or more) charge a delivery.
	Count(ctx context.Context, consumer string, key framework.Key, first int) (int, error)
	// Uncount takes back one delivery of key to consumer, in a short
	// transaction of its own: the delivery ended before it could take
	// effect because the service began to stop, after an attempt that ran
	// to its end (its retries were not started; see
	// middleware.Config.Stopping), so it does not count towards the
	// delivery limit. A count never goes below zero; a key without a
	// count gets one at zero: its delivery was a first one that the
	// transport vouched for, which cost nothing, and its redelivery then
	// counts as the first.
	Uncount(ctx context.Context, consumer string, key framework.Key) error
	// Forget removes the count of key inside tx, once its effect commits.
	Forget(ctx context.Context, tx *Tx, consumer string, key framework.Key) error

	// Advance moves the checkpoint of (consumer, subject), the highest
	// subject sequence that took effect, to seq inside tx when seq is
	// greater, and reports whether it moved. A concurrent attempt on the
	// same subject waits until the first one ends.
	Advance(ctx context.Context, tx *Tx, consumer, subject string, seq int64) (bool, error)
	// Checkpoint returns the sequence of (consumer, subject) that took
	// effect last, 0 when none did, and holds it for tx: attempts on one
	// subject take turns.
	Checkpoint(ctx context.Context, tx *Tx, consumer, subject string) (int64, error)
	// WaitGap records, in a transaction of its own, that the event key
	// with sequence seq waits for an earlier one of its subject, and
	// returns for how long it has waited, by the store's clock (the one
	// that stamped the wait). The wait does not count as a delivery: the
	// event's delivery count is set to zero, so that its redelivery,
	// which the transport flags, counts as the first. It takes the subject's
	// checkpoint as Checkpoint does, and records nothing, returning zero,
	// when the checkpoint is at seq or past it: the event took effect
	// (another copy of it) after this delivery found it waiting, and its
	// EndWait ended the wait for good.
	WaitGap(ctx context.Context, consumer, subject string, seq int64, key framework.Key, body []byte) (time.Duration, error)
	// EndWait removes the wait of (consumer, subject, seq), inside tx
	// when tx is not nil, and with it the hold or parking of the event
	// key (see HoldDeadLetter, Park): the event took effect or was
	// skipped as stale. It reports whether events of the subject are
	// parked after seq: once tx commits, those whose turn has come are
	// to be released (see Parked). It returns ErrSequenceTaken, removing
	// nothing, when another event holds seq, parked, held or skipped:
	// key's event claimed another's step, and must not take effect.
	EndWait(ctx context.Context, tx *Tx, consumer, subject string, seq int64, key framework.Key) (bool, error)

	// HoldDeadLetter stores dl as PublishDeadLetter does and, in the same
	// transaction, holds its subject: the event (dl.Key(), sequence
	// dl.SubjectSeq of dl.Subject) is a dead letter that the later events
	// of its subject wait behind, parked (see Park). The hold replaces the
	// event's own parking, if it was parked: so the event is parked or a
	// dead letter, never neither, whatever fails on the way. A hold at or
	// below the subject's checkpoint is not recorded, nor one of a dead
	// letter without a subject or sequence, nor one whose sequence
	// another event holds, parked, held or skipped (two events claimed
	// one step of the subject); the dead letter is. The hold ends when
	// the event takes effect (EndWait) or is skipped (Skip).
	HoldDeadLetter(ctx context.Context, dl DeadLetter) error
	// Park parks the event p, inside tx, when an event of its subject
	// between the checkpoint and p.Seq is held or parked, and reports
	// whether it did. A parked event is acknowledged but not processed:
	// Park removes the processed mark that tx made for p.Key. Parking
	// replaces a wait (WaitGap) of any event at p.Seq, and a parking or
	// hold of the same event; it never replaces another event's parking,
	// hold or skip at p.Seq, whose message or place in the sequence would
	// be lost: Park then returns ErrSequenceTaken and parks nothing.
	Park(ctx context.Context, tx *Tx, p ParkedEvent) (bool, error)
	// ParkGap parks the event p, which waits for an earlier event of its
	// subject (WaitGap), in a transaction of its own: its wait keeps the
	// message (topic, body, metadata), so that it can be acknowledged,
	// and it is released like an event parked behind a dead letter once
	// its turn comes (see Parked). Its wait's start stays its time
	// (ParkedEvent.At), which WaitGap goes on measuring from. It takes
	// the subject's checkpoint as Checkpoint does, so that an attempt
	// moving it either commits first, and then ParkGap reports false,
	// parking nothing, or sees the parked event in its EndWait. It also
	// reports false when p does not wait (no WaitGap of p.Key, or its
	// wait ended), and ErrSequenceTaken when another event holds p.Seq
	// (see Park).
	ParkGap(ctx context.Context, p ParkedEvent) (bool, error)
	// Parked lists the held and parked events that match f, by consumer,
	// subject and sequence.
	Parked(ctx context.Context, f ParkedFilter) ([]ParkedEvent, error)
	// Skip ends the hold of the dead letter key of (consumer, subject)
	// without its effect, as an operator who discards it asks: the
	// subject's sequence skips the held sequence and no other. When the
	// checkpoint is right before it, the checkpoint moves onto it, so the
	// events parked right behind it become ready (see Parked); when an
	// earlier event has not taken effect yet (a poison event overtook
	// it), the checkpoint moves past it once that one did (in the
	// EndWait of its effect). It returns the held sequence, or
	// ErrNotFound when key is not held.
	Skip(ctx context.Context, consumer, subject string, key framework.Key) (int64, error)

	// PublishDeadLetter stores a message that will not be processed,
	// durably, before it returns nil: the message is acknowledged right
	// after. A repeat of the same message for the same consumer updates
	// the existing dead letter and counts the repeat. A message whose key
	// is the consumer's dead letter's already, with another body (a
	// producer that sent two bodies under one id, a malformed copy of a
	// failed event), is stored under its body's digest instead
	// (framework.DigestKey), so that neither body is lost; the key of
	// dl.Key() is the one whose waits end and whose count is forgotten.
	// It forgets the message's delivery count in the same transaction, so
	// that a
	// replayed dead letter starts counting afresh, and ends the event's
	// wait or parking (WaitGap, ParkGap, Park) under dl.Key() at
	// dl.Subject and dl.SubjectSeq, if it has one: a parked event is the
	// only copy of its message, so it is parked or a dead letter, never
	// neither.
	PublishDeadLetter(ctx context.Context, dl DeadLetter) error
	// DeadLetter returns the dead letter with id, or ErrNotFound.
	DeadLetter(ctx context.Context, id int64) (DeadLetter, error)
	// DeadLetters lists dead letters that match f, oldest first.
	DeadLetters(ctx context.Context, f DeadLetterFilter) ([]DeadLetter, error)
	// ResolveDeadLetter moves a pending dead letter to r.Status (replayed
	// or discarded) and appends r to its history, in one transaction; a
	// replay also records, in that transaction, the dead letter's message
	// as a Replay to its consumer alone, which the service's replay relay
	// publishes (see ClaimReplays). So a replay is never half done, and a
	// failure of the replayed message, which comes after the commit,
	// always leaves the dead letter pending again. It returns the dead
	// letter as it was before, ErrNotFound when there is no dead letter
	// with id, and ErrNotPending (wrapped, naming the status) when it is
	// not pending: of concurrent resolutions of one dead letter, one wins.
	ResolveDeadLetter(ctx context.Context, id int64, r Resolution) (DeadLetter, error)
	// DeadLetterHistory returns every failure and resolution of the dead
	// letter id, oldest first. It is append-only: a repeat or a resolution
	// never changes an earlier entry.
	DeadLetterHistory(ctx context.Context, id int64) ([]HistoryEntry, error)

	// AddReplays records messages to hand to one consumer alone, each a
	// Replay of its own (the events parked behind a dead letter that an
	// operator releases, say), in a transaction of its own.
	AddReplays(ctx context.Context, rs []Replay) error
	// ClaimReplays claims up to limit unsent replays, oldest first, for
	// lease: another relay does not take them until the lease ends. It
	// claims no more of them than fit in ReplayClaimBytes together (their
	// bodies' sizes, counted before any is read), and always the first,
	// whatever its size.
	ClaimReplays(ctx context.Context, limit int, lease time.Duration) ([]Replay, error)
	// ReplaySent records that the replay id was published.
	ReplaySent(ctx context.Context, id int64) error

	// PurgeProcessed deletes up to limit of the oldest marks processed
	// before before, and returns how many it deleted. An event
	// redelivered after its mark was purged is processed again: keep
	// marks longer than any redelivery or replay can come late.
	PurgeProcessed(ctx context.Context, before time.Time, limit int) (int64, error)
	// Adopt gives consumer the processed marks, the subject checkpoints,
	// the dead letters (with their history, which records the adoption),
	// the delivery counts and the waits, holds, parked events and skips
	// of the consumer named from, which it was renamed from, in one
	// transaction, and returns how many marks it adopted. Where both
	// names have a place at one sequence of a subject, consumer's stays,
	// unless it is a wait; a parked event of from kept out by another
	// event's place becomes a dead letter of consumer
	// (CodeSequenceConflict), never lost. Running it again adopts only
	// what is new.
	Adopt(ctx context.Context, consumer, from string) (int64, error)
}

// DeadLetterStatus is the state of a dead letter.
type DeadLetterStatus string

// The states of a dead letter.
const (
	DeadLetterPending   DeadLetterStatus = "pending"
	DeadLetterReplayed  DeadLetterStatus = "replayed"
	DeadLetterDiscarded DeadLetterStatus = "discarded"
)

// DeadLetter is a message a consumer gave up on, with why (a code, never an
// error's text) and the original message, so it can be inspected and
// replayed.
type DeadLetter struct {
	// ID is assigned by the store.
	ID int64
	// Consumer is the name of the consumer that gave up.
	Consumer string
	// Topic is where the message was received.
	Topic string
	// Source and EventID identify the event. When the message did not
	// decode and its source and id are not both usable (see framework.BodyKey),
	// Source is empty and EventID "sha256:" and the hex digest of the body.
	Source  string
	EventID string
	// Type, Version, Subject and CorrelationID are copied from the event
	// when it could be decoded.
	Type          string
	Version       int
	Subject       string
	CorrelationID string
	// Code says why the message was dead-lettered.
	Code framework.Code
	// SubjectSeq is the event's subject sequence (subjectseq), 0 when it
	// has none: a bulk replay sends the dead letters of a subject in its
	// order.
	SubjectSeq int64
	// Attempts is the number of attempts of the last delivery.
	Attempts int
	// Deliveries is the message's delivery count when it was
	// dead-lettered last (1 for a first delivery), 0 when unknown.
	Deliveries int
	// Repeats counts how often the message came back after it was first
	// dead-lettered.
	Repeats int
	// FirstFailedAt and LastFailedAt are when it was dead-lettered first
	// and last.
	FirstFailedAt time.Time
	LastFailedAt  time.Time
	// Body and Metadata are the original message. Stores keep the body's
	// bytes as they are, and the metadata as StorableMetadata.
	Body     []byte
	Metadata map[string]string
	// Status is pending until an operator replays or discards it.
	Status DeadLetterStatus
	// Resolution says who resolved it last, when and why; zero while
	// pending. The dead letter's history keeps every resolution.
	Resolution Resolution
}

// HistoryKind says what a HistoryEntry records.
type HistoryKind string

// The kinds of history entries: a failure that stored or repeated the
// dead letter, an operator's resolution, a rename that adopted it.
const (
	HistoryFailed    HistoryKind = "failed"
	HistoryReplayed  HistoryKind = "replayed"
	HistoryDiscarded HistoryKind = "discarded"
	HistoryAdopted   HistoryKind = "adopted"
)

// HistoryEntry is one event in a dead letter's life.
type HistoryEntry struct {
	At   time.Time
	Kind HistoryKind
	// Code, Attempts and Deliveries describe a failure.
	Code       framework.Code
	Attempts   int
	Deliveries int
	// By and Reason describe a resolution; for an adoption, By is the
	// consumer's old name.
	By     string
	Reason string
}

// ReplayClaimBytes bounds the bodies one ClaimReplays returns, together
// (16 MiB): a dead letter keeps the body it came with, whatever its size,
// and a claim of many of them would otherwise hold them all in memory.
const ReplayClaimBytes = 16 << 20

// Replay is a message to hand to one consumer alone, through the
// transport's replay path: a replayed dead letter, or an event released
// from parking.
type Replay struct {
	// ID is assigned by the store.
	ID int64
	// DeadLetterID is the replayed dead letter, 0 for a released event.
	DeadLetterID int64
	Consumer     string
	Topic        string
	Body         []byte
	Metadata     map[string]string
	// CreatedAt is when it was recorded, by the store's clock.
	CreatedAt time.Time
}

// Key returns the key under which a dead letter is unique for its consumer.
func (dl DeadLetter) Key() framework.Key { return framework.Key{Source: dl.Source, ID: dl.EventID} }

// Validate reports the first field of dl that a Store cannot
// take: a missing consumer or event id, an invalid code, or a text field
// that not every store can hold (one that is not valid UTF-8 or holds NUL;
// PostgreSQL refuses both). The dead-letter step never builds such a dead
// letter: its key and attributes come from an event that Decode accepted,
// or else its key is framework.BodyKey. The error names the field, not
// its value. Metadata is not checked: stores keep StorableMetadata of it.
func (dl DeadLetter) Validate() error {
	switch {
	case dl.Consumer == "":
		return errors.New("publish dead letter: Consumer is empty")
	case dl.EventID == "":
		return fmt.Errorf("publish dead letter for %s: EventID is empty (use framework.BodyKey when the message has no id)", dl.Consumer)
	}
	for _, f := range []struct{ name, value string }{
		{"Consumer", dl.Consumer},
		{"Topic", dl.Topic},
		{"Source", dl.Source},
		{"EventID", dl.EventID},
		{"Type", dl.Type},
		{"Subject", dl.Subject},
		{"CorrelationID", dl.CorrelationID},
	} {
		if !storable(f.value) {
			return fmt.Errorf("publish dead letter: %s is not valid UTF-8 or holds NUL (key it with framework.BodyKey)", f.name)
		}
	}
	if !dl.Code.Valid() {
		return fmt.Errorf("publish dead letter %s for %s: invalid code %q", dl.Key(), dl.Consumer, dl.Code)
	}
	return nil
}

// Resolution records an operator's replay or discard of a dead letter.
type Resolution struct {
	Status DeadLetterStatus
	By     string
	Reason string
	At     time.Time
}

// The longest By and Reason a Resolution may hold, in bytes: a name and
// a sentence or a paragraph, not a document; every view of the dead
// letter's history shows them whole.
const (
	MaxResolutionBy     = 256
	MaxResolutionReason = 4096
)

// Validate reports the first part of r that no store can record: a
// status other than replayed or discarded, or a By or Reason that is not
// valid UTF-8 or holds NUL (PostgreSQL's text refuses both), or is longer
// than MaxResolutionBy or MaxResolutionReason. Its FieldError names the
// part ("status", "by", "reason"), never its value.
func (r Resolution) Validate() error {
	if r.Status != DeadLetterReplayed && r.Status != DeadLetterDiscarded {
		return &framework.FieldError{Field: "status", Reason: fmt.Sprintf("want %s or %s", DeadLetterReplayed, DeadLetterDiscarded)}
	}
	for _, f := range []struct {
		name, value string
		most        int
	}{{"by", r.By, MaxResolutionBy}, {"reason", r.Reason, MaxResolutionReason}} {
		if !storable(f.value) {
			return &framework.FieldError{Field: f.name, Reason: "is not valid UTF-8 text, or holds NUL"}
		}
		if len(f.value) > f.most {
			return &framework.FieldError{Field: f.name, Reason: fmt.Sprintf("is longer than %d bytes", f.most)}
		}
	}
	return nil
}

// DeadLetterFilter selects dead letters. Zero fields match everything.
type DeadLetterFilter struct {
	Consumer string
	Code     framework.Code
	Status   DeadLetterStatus
	Type     string
	Subject  string
	// Source and EventID select the dead letters of one event.
	Source  string
	EventID string
	// FailedSince and FailedBefore bound the time of the first failure:
	// at or after FailedSince, before FailedBefore.
	FailedSince  time.Time
	FailedBefore time.Time
	// AfterID lists dead letters with a greater ID, for paging.
	AfterID int64
	// Limit caps the number returned; zero means 100.
	Limit int
	// WithoutBody leaves out each dead letter's Body (empty), for a view
	// that counts or lists them without their messages: a body may be
	// as large as the transport's limit, the whole body of a too_large
	// dead letter.
	WithoutBody bool
}

// ParkedEvent is an event of a subject under strict order that waits,
// acknowledged but not processed, behind an earlier event of its subject
// that is a dead letter, or that has not arrived (see Store.ParkGap); or,
// when Held, that dead letter itself.
type ParkedEvent struct {
	Consumer string
	Subject  string
	Seq      int64
	// Key identifies the event.
	Key framework.Key
	// Topic, Body and Metadata are the message as it was received, to
	// hand it to the consumer again; empty when Held.
	Topic    string
	Body     []byte
	Metadata map[string]string
	// At is when it was parked or held, by the store's clock.
	At time.Time
	// Held says that the event is the dead letter that the later ones
	// wait behind.
	Held bool
	// Ready says that the event is parked and its turn has come: the
	// subject's checkpoint is right behind it.
	Ready bool
}

// DeadLetter returns the dead letter with code of the parked event p,
// failed at at: its key, message, subject and sequence, and the type,
// version and correlation id its body decodes to (none when it does not
// decode as p's event). A store's Adopt makes one of a parked event that
// another event's place keeps out (CodeSequenceConflict).
func (p ParkedEvent) DeadLetter(code framework.Code, at time.Time) DeadLetter {
	dl := DeadLetter{
		Consumer: p.Consumer, Topic: p.Topic, Source: p.Key.Source, EventID: p.Key.ID,
		Subject: p.Subject, SubjectSeq: p.Seq, Code: code,
		FirstFailedAt: at, LastFailedAt: at,
		Body: p.Body, Metadata: p.Metadata, Status: DeadLetterPending,
	}
	// Its own length as the limit: a consumer may take bodies over the
	// default's, and the body was taken once already.
	if env, err := framework.Decode(p.Body, len(p.Body)); err == nil && env.Key() == p.Key {
		dl.Type, dl.Version, dl.CorrelationID = env.Type, env.Version, env.CorrelationID
	}
	return dl
}

// ParkedBehind returns the events of ps (the held and parked events of
// dl's consumer and subject, see Store.Parked) that are parked behind dl:
// after it in its subject's sequence, when dl holds its subject. A dead
// letter that holds nothing (sequence_gap, sequence_conflict, or one
// whose hold ended) has none behind it.
func ParkedBehind(dl DeadLetter, ps []ParkedEvent) []ParkedEvent {
	if dl.Subject == "" || !slices.ContainsFunc(ps, func(p ParkedEvent) bool { return p.Held && p.Key == dl.Key() }) {
		return nil
	}
	var behind []ParkedEvent
	for _, p := range ps {
		if !p.Held && p.Consumer == dl.Consumer && p.Subject == dl.Subject && p.Seq > dl.SubjectSeq {
			behind = append(behind, p)
		}
	}
	return behind
}

// ParkedFilter selects held and parked events. Zero fields match
// everything.
type ParkedFilter struct {
	Consumer string
	Subject  string
	// Ready selects the parked events whose turn has come only.
	Ready bool
	// Limit caps the number returned; zero means no limit.
	Limit int
}

// ReplayMessage returns the message that replays dl: its original body
// and metadata under a new UUID, without the redelivery marker of the
// delivery that failed (the replay is a first delivery), its transport's
// unreadable marker (the replay is published anew, with metadata its
// transport reads: else it was dead-lettered as unreadable_message again,
// whatever the operator fixed) nor its publish time (the replay's
// transport tells its own), and with MetadataReplayOf set to dl's id.
// The operator's replay command, the test kit and the transport suite
// all replay with it.
func (dl DeadLetter) ReplayMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), dl.Body)
	for k, v := range dl.Metadata {
		switch k {
		case framework.MetadataRedelivered, framework.MetadataUnreadable, framework.MetadataUnreadableRaw, framework.MetadataPublishedAt:
		default:
			msg.Metadata.Set(k, v)
		}
	}
	msg.Metadata.Set(framework.MetadataReplayOf, strconv.FormatInt(dl.ID, 10))
	return msg
}

// ErrNotFound is returned by stores for a missing record.
var ErrNotFound = errors.New("not found")

// ErrNotPending is returned by stores when a dead letter to resolve is no
// longer pending: replayed or discarded already.
var ErrNotPending = errors.New("not pending")

// ErrSequenceTaken is returned by Store.Park, ParkGap and EndWait for an
// event whose subject's sequence number another event, with another id,
// holds: parked, a dead letter its subject waits behind, or a discarded
// one the sequence skips. Two events claimed one step of the subject; the
// second is dead-lettered (CodeSequenceConflict).
var ErrSequenceTaken = errors.New("another event holds the subject's sequence number")

// storable reports whether every store can hold s in a text column: valid
// UTF-8 without NUL (PostgreSQL refuses both).
func storable(s string) bool {
	return utf8.ValidString(s) && strings.IndexByte(s, 0) < 0
}

// storableString returns s with NUL and each run of bytes that are not
// UTF-8 replaced by U+FFFD.
func storableString(s string) string {
	if storable(s) {
		return s
	}
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

// StorableMetadata returns a copy of md that every store can hold: NUL and
// bytes that are not UTF-8, in its keys and values, replaced by U+FFFD
// (PostgreSQL's text and jsonb refuse them). When two keys become one, the
// value of the key first in byte order is kept. It returns nil when md is
// empty. Stores and the dead-letter step apply it to a dead letter's
// metadata, which comes from the transport as received.
func StorableMetadata(md map[string]string) map[string]string {
	if len(md) == 0 {
		return nil
	}
	out := make(map[string]string, len(md))
	for _, k := range slices.Sorted(maps.Keys(md)) {
		sk := storableString(k)
		if _, taken := out[sk]; !taken {
			out[sk] = storableString(md[k])
		}
	}
	return out
}
