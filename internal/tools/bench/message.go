package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"
)

// The event the scenarios feed: the example service's
// appointments.appointment.booked, version 1.
const (
	EventType    = "appointments.appointment.booked"
	EventSource  = "appointments"
	EventVersion = 1
)

// Message is one message a foreign producer sends: a CloudEvents 1.0
// JSON object of EventType.
type Message struct {
	// ID is the CloudEvent's id: a duplicate has the id of an earlier
	// message.
	ID string
	// Body is the CloudEvent, structured JSON.
	Body []byte
	// Subject is the CloudEvent's subject: the partition key a producer
	// of a partitioned consumer sends beside it (see amqpFeed).
	Subject string
}

// cloudEvent is the CloudEvent a foreign producer writes, and what a
// hand-written consumer reads of it.
type cloudEvent struct {
	SpecVersion  string    `json:"specversion"`
	ID           string    `json:"id"`
	Source       string    `json:"source"`
	Type         string    `json:"type"`
	EventVersion int       `json:"eventversion"`
	Subject      string    `json:"subject,omitempty"`
	Time         time.Time `json:"time"`
	Data         booked    `json:"data"`

	// SubjectSeq is the extension subjectseq, a decimal string; none
	// but in the ordering scenarios (see orderBacklog).
	SubjectSeq string `json:"subjectseq,omitempty"`
}

// booked is the data of the event (the example's appointments.BookedV1,
// written out as another program would).
type booked struct {
	AppointmentID string    `json:"appointmentId"`
	StartsAt      time.Time `json:"startsAt"`
}

// NewMessage returns the event of id, of appointment appt-id (its
// subject too), without subjectseq.
func NewMessage(id string) Message {
	return newMessage(id, "appt-"+id, 0)
}

// newMessage returns the event of id, of the appointment subject (its
// subject too), with subjectseq seq (none when 0).
func newMessage(id, subject string, seq int) Message {
	now := time.Now().UTC()
	ev := cloudEvent{
		SpecVersion:  "1.0",
		ID:           id,
		Source:       EventSource,
		Type:         EventType,
		EventVersion: EventVersion,
		Subject:      subject,
		Time:         now,
		Data:         booked{AppointmentID: subject, StartsAt: now.Add(24 * time.Hour).Truncate(time.Second)},
	}
	if seq > 0 {
		ev.SubjectSeq = strconv.Itoa(seq)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		panic(err) // a struct of strings and times always marshals
	}
	return Message{ID: id, Body: body, Subject: subject}
}

// Backlog returns n messages whose ids start with prefix, of which a share
// dup repeat an earlier event (the same message again, at a random later
// place), and the number of distinct events. The order is random but
// fixed by n.
func Backlog(prefix string, n int, dup float64) ([]Message, int) {
	repeats := int(float64(n) * dup)
	distinct := n - repeats
	msgs := make([]Message, 0, n)
	for i := range distinct {
		msgs = append(msgs, NewMessage(fmt.Sprintf("%s-%d", prefix, i)))
	}
	return withRepeats(msgs, repeats, uint64(n)), distinct
}

// withRepeats inserts repeats messages into msgs, each a copy of an
// earlier one at a random later place, in an order fixed by seed.
func withRepeats(msgs []Message, repeats int, seed uint64) []Message {
	rng := rand.New(rand.NewPCG(seed, 1))
	for range repeats {
		at := rng.IntN(len(msgs))
		pos := at + 1 + rng.IntN(len(msgs)-at)
		msgs = slices.Insert(msgs, pos, msgs[at])
	}
	return msgs
}

// Events returns n distinct messages whose ids start with prefix.
func Events(prefix string, n int) []Message {
	msgs := make([]Message, n)
	for i := range msgs {
		msgs[i] = NewMessage(fmt.Sprintf("%s-%d", prefix, i))
	}
	return msgs
}

// Pace calls send for each message at rate messages per second, on a
// fixed schedule (a late send does not shift the ones after it), and
// returns the time each send began.
func Pace(ctx context.Context, rate float64, msgs []Message, send func(context.Context, Message) error) ([]time.Time, error) {
	sent := make([]time.Time, len(msgs))
	start := time.Now()
	interval := time.Duration(float64(time.Second) / rate)
	timer := time.NewTimer(0)
	defer timer.Stop()
	for i, m := range msgs {
		if wait := time.Until(start.Add(time.Duration(i) * interval)); wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-timer.C:
			}
		}
		sent[i] = time.Now()
		if err := send(ctx, m); err != nil {
			return nil, fmt.Errorf("send %s: %w", m.ID, err)
		}
	}
	return sent, nil
}

// Percentile returns the p-th percentile (0..100) of ds by nearest rank;
// ds is sorted in place.
func Percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(float64(len(ds))*p/100)) - 1
	return ds[max(0, min(i, len(ds)-1))]
}
