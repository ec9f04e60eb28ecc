package framework

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// IdempotencyKey derives the key a handler passes to an outside service
// (e-mail, SMS, payment) so that the service does the call once although
// the handler may run more than once: it is the same on every redelivery
// of the event to the consumer, and differs between consumers and events.
// The key is 64 hex digits.
func IdempotencyKey(consumer string, key Key) string {
	h := sha256.New()
	for _, s := range []string{consumer, key.Source, key.ID} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

type attemptKey struct{}

type attempt struct {
	consumer string
	key      Key
}

// IdempotencyKeyFromContext returns the IdempotencyKey of the event that
// the attempt running in ctx handles.
func IdempotencyKeyFromContext(ctx context.Context) (string, bool) {
	a, ok := ctx.Value(attemptKey{}).(attempt)
	if !ok {
		return "", false
	}
	return IdempotencyKey(a.consumer, a.key), true
}
