package framework

import (
	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// The media type of a message body, and the metadata keys the framework
// reads from and writes to watermill messages.
const (
	// ContentType is the media type of every message body: one CloudEvent
	// in structured JSON mode.
	ContentType = "application/cloudevents+json"
	// MetadataContentType holds ContentType on every message the framework
	// publishes.
	MetadataContentType = "content-type"
	// MetadataRedelivered is set by a transport that can tell a redelivery:
	// "true" when the message was delivered before, "false" when this is
	// its first delivery. Without it the delivery guard counts every
	// delivery durably.
	MetadataRedelivered = pipeline.MetadataRedelivered
	// MetadataUnreadable is set by a SQL transport on a message whose
	// stored row it could not read as published (its metadata is not a
	// JSON object of strings): the value says what was wrong. The chain
	// dead-letters such a message with CodeUnreadableMessage instead of
	// the subscription stalling on it. It is the transport's word on one
	// delivery, never the message's: the transports drop it, and
	// MetadataUnreadableRaw, from the metadata a producer sent, and a
	// replay drops them from the dead letter's.
	MetadataUnreadable = "effectively_unreadable"
	// MetadataUnreadableRaw keeps the stored metadata text of an
	// unreadable message, as valid UTF-8 without NUL, cut at 8 KiB.
	MetadataUnreadableRaw = "effectively_unreadable_metadata"
	// MetadataPublishedAt is set by a transport on a delivered message:
	// when it was published, in RFC 3339 with nanoseconds in UTC
	// (time.RFC3339Nano), by the transport's clock: PostgreSQL's is the
	// subscriber's clock less the message's age by the server's, SQLite's
	// and the memory transport's the publisher's, RabbitMQ's the
	// publisher's AMQP timestamp, in whole seconds. It is the transport's word on
	// one delivery, never the message's: the transports drop a
	// producer's value of it, as they drop MetadataUnreadable. The
	// histogram effectively_event_age_seconds takes it for an event
	// without a CloudEvent time. A transport of its own may set it; one
	// that does not leaves such events unobserved.
	MetadataPublishedAt = "effectively_published_at"
	// MetadataReplayOf is set on a replayed message (see
	// DeadLetter.ReplayMessage): the id of the dead letter it replays.
	MetadataReplayOf = "effectively_replay_of"
)

// NewMessage encodes env as a watermill message whose payload is the
// CloudEvent and whose UUID is the event id.
func NewMessage(env Envelope) (*message.Message, error) {
	body, err := Encode(env)
	if err != nil {
		return nil, err
	}
	msg := message.NewMessage(env.ID, body)
	msg.Metadata.Set(MetadataContentType, ContentType)
	return msg, nil
}
