package framework

import (
	"fmt"
	"strconv"

	"github.com/ThreeDotsLabs/watermill"

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
	// MetadataReplayOf is set on a replayed message (see
	// DeadLetter.ReplayMessage): the id of the dead letter it replays.
	MetadataReplayOf = "effectively_replay_of"
)

// ReplayMessage returns the message that replays dl: its original body
// and metadata under a new UUID, without the redelivery marker of the
// delivery that failed (the replay is a first delivery) nor its
// transport's unreadable marker (the replay is published anew, with
// metadata its transport reads: else it was dead-lettered as
// unreadable_message again, whatever the operator fixed), and with
// MetadataReplayOf set to dl's id. The operator's replay command, the
// test kit and the transport suite all replay with it.
func (dl DeadLetter) ReplayMessage() *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), dl.Body)
	for k, v := range dl.Metadata {
		if !deliveryMarker(k) {
			msg.Metadata.Set(k, v)
		}
	}
	msg.Metadata.Set(MetadataReplayOf, strconv.FormatInt(dl.ID, 10))
	return msg
}

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

// DecodeMessage decodes msg's payload (see Decode). A message that its
// transport marked unreadable (see MetadataUnreadable) fails permanently
// with CodeUnreadableMessage, whatever its payload.
func DecodeMessage(msg *message.Message, maxBody int) (Envelope, error) {
	if reason, ok := msg.Metadata[MetadataUnreadable]; ok {
		return Envelope{}, Permanent(CodeUnreadableMessage, fmt.Errorf("message %s: unreadable: %s", msg.UUID, reason))
	}
	env, err := Decode(msg.Payload, maxBody)
	if err != nil {
		return Envelope{}, fmt.Errorf("message %s: %w", msg.UUID, err)
	}
	return env, nil
}

// deliveryMarker reports whether the metadata key k is one that a
// transport sets on one delivery, never part of the message: the
// redelivery and unreadable markers.
func deliveryMarker(k string) bool {
	return k == MetadataRedelivered || k == MetadataUnreadable || k == MetadataUnreadableRaw
}
