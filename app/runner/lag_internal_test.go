package runner

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// TestFlightsAgeFromPublishedAt: a message in flight is aged from when
// its transport says it was published (framework.MetadataPublishedAt),
// else, without it, with one that does not parse or one in the future,
// from when it was handed.
func TestFlightsAgeFromPublishedAt(t *testing.T) {
	t.Parallel()
	const consumer = "c"
	age := func(publishedAt string) time.Duration {
		f := newFlights()
		f.consumers[""] = consumer // a message outside a router names no handler
		msg := message.NewMessage(watermill.NewUUID(), nil)
		if publishedAt != "" {
			msg.Metadata.Set(framework.MetadataPublishedAt, publishedAt)
		}
		f.enter(msg)
		return f.oldest(consumer, 0, time.Now())
	}
	require.InDelta(t, time.Hour.Seconds(), age(time.Now().Add(-time.Hour).UTC().Format(time.RFC3339Nano)).Seconds(), 5, "since published")
	for _, v := range []string{"", "an hour ago", time.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)} {
		require.Lessf(t, age(v), 5*time.Second, "published at %q: since handed", v)
	}
}
