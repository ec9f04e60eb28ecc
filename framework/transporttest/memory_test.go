package transporttest_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/framework/transporttest"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestMemory runs the suite on the memory transport, GoChannel, whose every
// subscription gets every message: duplicates galore, which the dedup
// absorbs.
func TestMemory(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
		db := testenv.SQLite(t)
		store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
		require.NoError(t, err)
		tr, err := memory.New(memory.PubSubConfig{NackDelay: 20 * time.Millisecond})
		require.NoError(t, err)
		return &transporttest.Env{
			DB:        db,
			Store:     store,
			Transport: tr,
			// What a producer without watermill sends: a body, no metadata.
			PublishRaw: func(t *testing.T, topic string, body []byte) {
				require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(watermill.NewUUID(), body)))
			},
		}
	})
}
