package app_test

import (
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
)

// TestConsumerFromContext: the service's own middleware, Outer and Inner,
// reads the name of the consumer it runs in with
// framework.ConsumerFromContext, on a message's first delivery and on the
// operator's replay of its dead letter, which reaches the consumer through
// its replay topic under another handler name of the router.
func TestConsumerFromContext(t *testing.T) {
	t.Parallel()
	type seen struct {
		step, consumer, handler string
		ok                      bool
	}
	var (
		mu        sync.Mutex
		got       []seen
		rejecting atomic.Bool
	)
	rejecting.Store(true)
	record := func(step string) message.HandlerMiddleware {
		return func(next message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				name, ok := framework.ConsumerFromContext(msg.Context())
				mu.Lock()
				got = append(got, seen{step: step, consumer: name, handler: message.HandlerNameFromCtx(msg.Context()), ok: ok})
				mu.Unlock()
				if step == "outer" && rejecting.Load() {
					return nil, framework.Permanent("not_yet", errors.New("refused until the replay"))
				}
				return next(msg)
			}
		}
	}
	cfg := testConfig(t)
	b := setup(t, cfg, fx.Supply(app.Middleware{
		Outer: []message.HandlerMiddleware{record("outer")},
		Inner: []message.HandlerMiddleware{record("inner")},
	}))
	b.publish(t, "w-1", "sprocket")
	waitFor(t, "the dead letter", func() bool { return b.count(t, `SELECT count(*) FROM dead_letters`) == 1 })
	rejecting.Store(false)
	out, err := runCommand(t, commandOptions(cfg), "dead-letters", "replay", "--consumer", consumerName, "--by", "tester", "--reason", "try again")
	require.NoError(t, err)
	require.Contains(t, out, "1 replayed, 0 refused")
	waitFor(t, "the replayed widget", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 1 })

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 3, "the first delivery's Outer, then the replay's Outer and Inner: %+v", got)
	first, replay := got[0].handler, got[1].handler
	require.NotEqual(t, first, replay, "the replay comes under another handler name")
	require.Equal(t, []seen{
		{step: "outer", consumer: consumerName, handler: first, ok: true},
		{step: "outer", consumer: consumerName, handler: replay, ok: true},
		{step: "inner", consumer: consumerName, handler: replay, ok: true},
	}, got)
}
