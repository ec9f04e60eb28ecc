package amqp

import (
	"bytes"
	"encoding/binary"
	"maps"
	"math"
	"slices"
	"strconv"
	"testing"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// FuzzUnmarshal feeds the Marshaler any delivery a broker may hand over:
// any body, message id, content type and redelivered flag, and headers of
// every AMQP field type (decoded from the fuzzer's bytes by fieldReader).
// Unmarshal never fails or panics: the message keeps the body, takes an
// id, says whether it is a redelivery as the broker does, and carries
// every header as text; published again (a replay), it comes back with the
// same id and metadata. The seed corpus holds every input of the bad-input
// catalog that carries headers or metadata.
func FuzzUnmarshal(f *testing.F) {
	seeds := map[string][]any{}
	for _, in := range transporttest.Catalog("notes.note.added") {
		headers := in.Headers
		if headers == nil && in.Metadata != nil {
			headers = make(map[string]any, len(in.Metadata))
			for k, v := range in.Metadata {
				headers[k] = v
			}
		}
		if headers != nil {
			seeds["catalog-"+in.Name] = []any{in.Body, encodeFields(headers), "", framework.ContentType, true}
		}
	}
	testenv.SeedCorpus(f, seeds)
	f.Add([]byte(`{}`), []byte(nil), "", "", false)
	f.Fuzz(func(t *testing.T, body, headers []byte, messageID, contentType string, redelivered bool) {
		d := amqp091.Delivery{
			Headers:     (&fieldReader{b: headers}).table(0),
			Body:        body,
			MessageId:   messageID,
			ContentType: contentType,
			Redelivered: redelivered,
		}
		msg, err := Marshaler{}.Unmarshal(d)
		if err != nil {
			t.Fatalf("Unmarshal failed: %v", err)
		}
		requireDelivered(t, d, msg)
		pub, err := Marshaler{}.Marshal(msg)
		if err != nil {
			t.Fatalf("Marshal failed: %v", err)
		}
		if err := pub.Headers.Validate(); err != nil {
			t.Fatalf("the publishing's headers are not an AMQP table: %v", err)
		}
		again, err := Marshaler{}.Unmarshal(amqp091.Delivery{Headers: pub.Headers, Body: pub.Body, MessageId: pub.MessageId, ContentType: pub.ContentType})
		if err != nil {
			t.Fatalf("Unmarshal of the publishing failed: %v", err)
		}
		if again.UUID != msg.UUID || !bytes.Equal(again.Payload, msg.Payload) {
			t.Fatalf("published again, %q %q came back as %q %q", msg.UUID, msg.Payload, again.UUID, again.Payload)
		}
		// Markers of one delivery are not published again.
		for _, k := range []string{framework.MetadataRedelivered, wamqp.MetadataRedeliveredKey} {
			delete(msg.Metadata, k)
			delete(again.Metadata, k)
		}
		if !maps.Equal(msg.Metadata, again.Metadata) {
			t.Fatalf("published again, metadata %q came back as %q", msg.Metadata, again.Metadata)
		}
	})
}

// requireDelivered checks the message Unmarshal made of d.
func requireDelivered(t *testing.T, d amqp091.Delivery, msg *message.Message) {
	t.Helper()
	if !bytes.Equal(msg.Payload, d.Body) {
		t.Fatalf("payload %q, body %q", msg.Payload, d.Body)
	}
	want, _ := d.Headers[wamqp.DefaultMessageUUIDHeaderKey].(string)
	if want == "" {
		want = d.MessageId
	}
	if msg.UUID == "" || want != "" && msg.UUID != want {
		t.Fatalf("UUID %q, want %q", msg.UUID, want)
	}
	if got := msg.Metadata.Get(framework.MetadataRedelivered); got != strconv.FormatBool(d.Redelivered) {
		t.Fatalf("%s is %q, the delivery's flag %v", framework.MetadataRedelivered, got, d.Redelivered)
	}
	for _, k := range []string{framework.MetadataUnreadable, framework.MetadataUnreadableRaw} {
		if _, ok := msg.Metadata[k]; ok {
			t.Fatalf("header %q came through: only a SQL transport marks a message unreadable", k)
		}
	}
	if got, ok := msg.Metadata[framework.MetadataPublishedAt]; d.Timestamp.IsZero() && ok ||
		!d.Timestamp.IsZero() && got != d.Timestamp.UTC().Format(time.RFC3339Nano) {
		t.Fatalf("%s is %q, the delivery's timestamp %v", framework.MetadataPublishedAt, got, d.Timestamp)
	}
	for k, v := range d.Headers {
		if k == wamqp.DefaultMessageUUIDHeaderKey || k == framework.MetadataRedelivered || k == framework.MetadataPublishedAt ||
			k == framework.MetadataUnreadable || k == framework.MetadataUnreadableRaw {
			continue
		}
		got, ok := msg.Metadata[k]
		if !ok {
			t.Fatalf("header %q is not in the metadata", k)
		}
		if s, isString := v.(string); isString && got != s {
			t.Fatalf("header %q = %q became %q", k, s, got)
		}
	}
}

// fieldReader reads AMQP field values from fuzzer bytes: a type byte,
// then the value. It reads zero values once the bytes run out.
type fieldReader struct{ b []byte }

// The field types fieldReader reads, by type byte modulo fieldTypes.
const (
	fieldNil = iota
	fieldString
	fieldBytes
	fieldBool
	fieldInt8
	fieldUint8
	fieldInt16
	fieldUint16
	fieldInt32
	fieldUint32
	fieldInt64
	fieldFloat32
	fieldFloat64
	fieldTime
	fieldDecimal
	fieldTable
	fieldArray
	fieldTypes
)

// maxDepth bounds the nesting of tables and arrays.
const maxDepth = 4

func (r *fieldReader) next(n int) []byte {
	n = min(n, len(r.b))
	out := r.b[:n]
	r.b = r.b[n:]
	return out
}

func (r *fieldReader) byte() byte {
	if b := r.next(1); len(b) == 1 {
		return b[0]
	}
	return 0
}

func (r *fieldReader) uint64(n int) uint64 {
	var buf [8]byte
	copy(buf[:], r.next(n))
	return binary.LittleEndian.Uint64(buf[:])
}

func (r *fieldReader) text() string { return string(r.next(int(r.byte()))) }

// table reads a count of entries, then each key and value.
func (r *fieldReader) table(depth int) amqp091.Table {
	n := int(r.byte() % 16)
	t := make(amqp091.Table, n)
	for range n {
		k := string(r.next(int(r.byte() % 24)))
		t[k] = r.field(depth)
	}
	return t
}

func (r *fieldReader) field(depth int) any {
	switch r.byte() % fieldTypes {
	case fieldString:
		return r.text()
	case fieldBytes:
		return []byte(r.text())
	case fieldBool:
		return r.byte()%2 == 1
	case fieldInt8:
		return int8(r.byte())
	case fieldUint8:
		return r.byte()
	case fieldInt16:
		return int16(r.uint64(2))
	case fieldUint16:
		return uint16(r.uint64(2))
	case fieldInt32:
		return int32(r.uint64(4))
	case fieldUint32:
		return uint32(r.uint64(4))
	case fieldInt64:
		return int64(r.uint64(8))
	case fieldFloat32:
		return math.Float32frombits(uint32(r.uint64(4)))
	case fieldFloat64:
		return math.Float64frombits(r.uint64(8))
	case fieldTime:
		return time.Unix(int64(r.uint64(8)), 0) // AMQP timestamps are seconds
	case fieldDecimal:
		return amqp091.Decimal{Scale: r.byte(), Value: int32(r.uint64(4))}
	case fieldTable:
		if depth < maxDepth {
			return r.table(depth + 1)
		}
	case fieldArray:
		if depth < maxDepth {
			a := make([]any, r.byte()%8)
			for i := range a {
				a[i] = r.field(depth + 1)
			}
			return a
		}
	}
	return nil
}

// encodeFields writes headers as fieldReader reads them, for seeds: the
// catalog's types (string, []byte, bool, int32, int64, float64,
// time.Time, nil, []any and map[string]any) in key order.
func encodeFields(headers map[string]any) []byte {
	var b []byte
	b = append(b, byte(len(headers)))
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		b = append(b, byte(len(k)))
		b = append(b, k...)
		b = appendField(b, headers[k])
	}
	return b
}

func appendField(b []byte, v any) []byte {
	switch v := v.(type) {
	case string:
		return append(append(b, fieldString, byte(len(v))), v...)
	case []byte:
		return append(append(b, fieldBytes, byte(len(v))), v...)
	case bool:
		if v {
			return append(b, fieldBool, 1)
		}
		return append(b, fieldBool, 0)
	case int32:
		return binary.LittleEndian.AppendUint32(append(b, fieldInt32), uint32(v))
	case int64:
		return binary.LittleEndian.AppendUint64(append(b, fieldInt64), uint64(v))
	case float64:
		return binary.LittleEndian.AppendUint64(append(b, fieldFloat64), math.Float64bits(v))
	case time.Time:
		return binary.LittleEndian.AppendUint64(append(b, fieldTime), uint64(v.Unix()))
	case map[string]any:
		return append(append(b, fieldTable), encodeFields(v)...)
	case []any:
		b = append(b, fieldArray, byte(len(v)))
		for _, e := range v {
			b = appendField(b, e)
		}
		return b
	default:
		return append(b, fieldNil)
	}
}
