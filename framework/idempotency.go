package framework

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	"github.com/google/uuid"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// IdempotencyKey derives the key a handler passes to an outside service
// (e-mail, SMS, payment) so that the service does the call once although
// the handler may run more than once: it is the same on every redelivery
// of the event to the consumer, and differs between consumers and events.
// The key is 64 hex digits.
func IdempotencyKey(consumer string, key Key) string {
	sum := sha256.Sum256(tuple(consumer, key.Source, key.ID))
	return hex.EncodeToString(sum[:])
}

// followUpSpace is the UUID name space of FollowUpID.
var followUpSpace = uuid.MustParse("5b0f6f0e-6f0c-4d1e-9a59-6566656374a1")

// FollowUpID returns the id of an event that handling the event cause
// produces, named name ("reminder-mail", say): a name-based UUID (version
// 5) of cause's source and id and name. A handler retried, or an event
// delivered twice, produces a follow-up with the same id, which the outbox
// then records once and consumers deduplicate; follow-ups of different
// causes, or of different names, differ.
func FollowUpID(cause Key, name string) string {
	return uuid.NewSHA1(followUpSpace, tuple(cause.Source, cause.ID, name)).String()
}

// tuple encodes parts unambiguously: each one preceded by its length.
func tuple(parts ...string) []byte {
	var b []byte
	for _, p := range parts {
		b = binary.AppendUvarint(b, uint64(len(p)))
		b = append(b, p...)
	}
	return b
}

// IdempotencyKeyFromContext returns the IdempotencyKey of the event that
// the attempt running in ctx handles.
func IdempotencyKeyFromContext(ctx context.Context) (string, bool) {
	a, ok := pipeline.From[pipeline.Attempt](ctx)
	if !ok {
		return "", false
	}
	return IdempotencyKey(a.Consumer, Key{Source: a.Source, ID: a.ID}), true
}
