package amqp

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
)

// Marshaler turns watermill messages into AMQP publishings and back. Unlike
// watermill-amqp's DefaultMarshaler it never fails on a delivery, which
// would nack it before any middleware runs and loop forever:
//
//   - headers that are not strings (x-death added by dead-lettering,
//     x-delivery-count added by quorum queues, numbers and tables from
//     other clients) become metadata as text: numbers and booleans in
//     decimal, times in RFC 3339, tables and arrays as JSON;
//   - a delivery without watermill's UUID header takes the AMQP
//     message-id, or a generated UUID (the framework identifies events by
//     their CloudEvent source and id, never by this UUID);
//   - the delivery's redelivered flag becomes framework.MetadataRedelivered
//     ("true" or "false"), and its content type the metadata
//     framework.MetadataContentType when no header gives one;
//   - headers framework.MetadataUnreadable and MetadataUnreadableRaw are
//     dropped: they are a SQL transport's word on a stored row, and a
//     producer's would have a good event dead-lettered;
//   - the delivery's AMQP timestamp, when it has one, becomes
//     framework.MetadataPublishedAt (a header of that name is dropped: it
//     is the transport's word, never a producer's). AMQP timestamps are
//     whole seconds, so it is up to a second early.
//
// Published messages are persistent, carry the UUID both in watermill's
// header and as the message-id, the publisher's clock as their AMQP
// timestamp, and their metadata as string headers, less the redelivery
// markers and the publishing time of an earlier delivery.
type Marshaler struct{}

var _ wamqp.Marshaler = Marshaler{}

// Marshal returns the publishing of msg.
func (Marshaler) Marshal(msg *message.Message) (amqp091.Publishing, error) {
	headers := make(amqp091.Table, len(msg.Metadata)+1)
	for k, v := range msg.Metadata {
		if k == framework.MetadataRedelivered || k == wamqp.MetadataRedeliveredKey || k == framework.MetadataPublishedAt {
			continue // a property of one delivery, not of the message
		}
		headers[k] = v
	}
	headers[wamqp.DefaultMessageUUIDHeaderKey] = msg.UUID
	return amqp091.Publishing{
		Headers:      headers,
		ContentType:  msg.Metadata.Get(framework.MetadataContentType),
		DeliveryMode: amqp091.Persistent,
		MessageId:    messageID(msg.UUID),
		Timestamp:    time.Now().UTC(),
		Body:         msg.Payload,
	}, nil
}

// messageID is the AMQP message-id of a message whose UUID is id: id
// itself when it fits in a short string, else the digest that keys a body
// (framework.DigestKey: "sha256:" and 64 hex digits). A UUID may be an event's id, which may take
// framework.MaxIDBytes (256), one byte more than a short string: the
// outbox relay's publish of such an event failed at every poll, and held
// up every row behind it. The whole UUID travels in watermill's UUID
// header, which Unmarshal reads first.
func messageID(id string) string {
	if len(id) <= shortStringMax {
		return id
	}
	return framework.DigestKey([]byte(id)).ID
}

// Unmarshal returns the message of d. It never fails.
func (Marshaler) Unmarshal(d amqp091.Delivery) (*message.Message, error) {
	id, _ := d.Headers[wamqp.DefaultMessageUUIDHeaderKey].(string)
	if id == "" {
		id = d.MessageId
	}
	if id == "" {
		id = watermill.NewUUID()
	}
	msg := message.NewMessage(id, d.Body)
	msg.Metadata = make(message.Metadata, len(d.Headers)+3)
	for k, v := range d.Headers {
		switch k {
		case wamqp.DefaultMessageUUIDHeaderKey, framework.MetadataPublishedAt,
			framework.MetadataUnreadable, framework.MetadataUnreadableRaw:
			// The unreadable markers are a SQL transport's word on a
			// row, the publishing time this one's: never a producer's.
			continue
		}
		msg.Metadata[k] = headerText(v)
	}
	if msg.Metadata.Get(framework.MetadataContentType) == "" && d.ContentType != "" {
		msg.Metadata.Set(framework.MetadataContentType, d.ContentType)
	}
	msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(d.Redelivered))
	if !d.Timestamp.IsZero() {
		msg.Metadata.Set(framework.MetadataPublishedAt, d.Timestamp.UTC().Format(time.RFC3339Nano))
	}
	return msg, nil
}

// ErrHeadersTooLarge is returned by a publish whose message's properties
// (its metadata as headers, its content type and message id) do not fit
// in one frame of the connection: RabbitMQ answers such a frame by
// closing the whole connection, with the channels of every consumer on
// it. A message the broker delivered fits, but its metadata may not once
// it is text: typed headers rendered as text (tables as JSON), and a
// dead letter's NUL bytes each stored as U+FFFD, three bytes (see
// driver.StorableMetadata), so that a replay may not fit.
//
// It is also returned for a header's name, a content type or a message id
// longer than 255 bytes, which AMQP carries as short strings: amqp091-go
// would write such a one with its length cut to a byte, corrupting it.
// Marshaler writes a longer UUID's digest as the message id (see
// messageID).
var ErrHeadersTooLarge = errors.New("amqp: the message's headers do not fit in one frame")

// shortStringMax is the longest short string of AMQP 0-9-1, in bytes.
const shortStringMax = 255

// frameOverhead is what a frame holds besides its payload: its type,
// channel and size (7 bytes) and its end marker (1 byte). A frame may be
// at most the connection's negotiated frame size, overhead included.
const frameOverhead = 7 + 1

// checkFrame returns ErrHeadersTooLarge, wrapped with the sizes, when the
// content header frame of p is longer than frameMax, the connection's
// negotiated frame size (0: no limit), or when one of its short strings
// is longer than AMQP allows.
func checkFrame(p amqp091.Publishing, frameMax int) error {
	for _, f := range []struct{ name, value string }{{"content type", p.ContentType}, {"message id", p.MessageId}} {
		if len(f.value) > shortStringMax {
			return fmt.Errorf("%w: a %s of %d bytes, at most %d", ErrHeadersTooLarge, f.name, len(f.value), shortStringMax)
		}
	}
	for k := range p.Headers {
		if len(k) > shortStringMax {
			return fmt.Errorf("%w: a header name of %d bytes, at most %d", ErrHeadersTooLarge, len(k), shortStringMax)
		}
	}
	if size := headerFrameSize(p); frameMax > 0 && size > frameMax {
		return fmt.Errorf("%w: %d bytes, the connection's frame size is %d", ErrHeadersTooLarge, size, frameMax)
	}
	return nil
}

// headerFrameSize returns the length of the content header frame of p as
// amqp091-go writes it: the frame's overhead, the class, weight, body
// size and property flags (14 bytes), each property that is set, and the
// headers as a table of the string values Marshaler gives them (any other
// value counted as 9 bytes, a 64-bit number's).
func headerFrameSize(p amqp091.Publishing) int {
	size := frameOverhead + 14
	for _, s := range []string{
		p.ContentType, p.ContentEncoding, p.CorrelationId, p.ReplyTo,
		p.Expiration, p.MessageId, p.Type, p.UserId, p.AppId,
	} {
		if s != "" {
			size += 1 + len(s)
		}
	}
	if p.DeliveryMode != 0 {
		size++
	}
	if p.Priority != 0 {
		size++
	}
	if !p.Timestamp.IsZero() {
		size += 8
	}
	if len(p.Headers) > 0 {
		size += 4
		for k, v := range p.Headers {
			size += 1 + len(k)
			switch v := v.(type) {
			case string:
				size += 1 + 4 + len(v)
			case []byte:
				size += 1 + 4 + len(v)
			default:
				size += 1 + 8
			}
		}
	}
	return size
}

// headerText renders an AMQP field value as metadata text.
func headerText(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case []byte:
		return string(v)
	case bool:
		return strconv.FormatBool(v)
	case int8, int16, int32, int64, int, uint8, uint16, uint32, uint64, uint:
		return fmt.Sprint(v)
	case float32:
		return strconv.FormatFloat(float64(v), 'g', -1, 32)
	case float64:
		return strconv.FormatFloat(v, 'g', -1, 64)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	case amqp091.Decimal:
		return fmt.Sprintf("%de-%d", v.Value, v.Scale)
	default: // amqp091.Table, []any (x-death is an array of tables)
		b, err := json.Marshal(jsonable(v))
		if err != nil {
			return fmt.Sprint(v)
		}
		return string(b)
	}
}

// jsonable turns AMQP tables and arrays into values encoding/json renders
// readably (bytes as text rather than base64).
func jsonable(v any) any {
	switch v := v.(type) {
	case amqp091.Table:
		m := make(map[string]any, len(v))
		for k, e := range v {
			m[k] = jsonable(e)
		}
		return m
	case []any:
		s := make([]any, len(v))
		for i, e := range v {
			s[i] = jsonable(e)
		}
		return s
	case []byte:
		return string(v)
	case time.Time:
		return v.UTC().Format(time.RFC3339Nano)
	default:
		return v
	}
}
