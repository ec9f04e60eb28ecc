package transporttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/framework/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// processSub gives one process its own view of a shared memory.PubSub:
// closing it ends that process's subscriptions, not the PubSub.
type processSub struct {
	ch     *memory.PubSub
	ctx    context.Context
	cancel context.CancelFunc
}

func (p *processSub) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	ctx, cancel := context.WithCancel(ctx)
	context.AfterFunc(p.ctx, cancel)
	return p.ch.Subscribe(ctx, topic)
}

func (p *processSub) Close() error { p.cancel(); return nil }

// TestMemory runs the suite on the memory transport, GoChannel, whose every
// subscription gets every message: duplicates galore, which the dedup
// absorbs.
func TestMemory(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
		db := testenv.SQLite(t)
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		ch, err := memory.NewPubSub(memory.PubSubConfig{NackDelay: 20 * time.Millisecond})
		require.NoError(t, err)
		t.Cleanup(func() { _ = ch.Close() })
		return &transporttest.Env{
			DB:        db,
			Store:     store,
			Publisher: ch,
			NewSubscriber: func(_ *testing.T, _ string, _ int) message.Subscriber {
				ctx, cancel := context.WithCancel(context.Background())
				return &processSub{ch: ch, ctx: ctx, cancel: cancel}
			},
			// Only the consumer subscribes to its replay topic.
			Topics: func(consumer string, types []string, _ int) []string {
				return append(types, framework.ReplayTopic(consumer))
			},
			Replay: func(_ context.Context, consumer string, msg *message.Message) error {
				return ch.Publish(framework.ReplayTopic(consumer), msg)
			},
			// What a producer without watermill sends: a body, no metadata.
			PublishRaw: func(t *testing.T, topic string, body []byte) {
				require.NoError(t, ch.Publish(topic, message.NewMessage(watermill.NewUUID(), body)))
			},
		}
	})
}
