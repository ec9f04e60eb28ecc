package transporttest_test

import (
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/memory"
)

// TestMemory runs the suite on the memory transport, GoChannel.
func TestMemory(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, func(t *testing.T) *transporttest.Env {
		tr, err := memory.New(memory.TransportConfig{NackDelay: 20 * time.Millisecond})
		require.NoError(t, err)
		return &transporttest.Env{
			Transport: tr,
			// What a producer without watermill sends: a body, no metadata.
			PublishRaw: func(t *testing.T, topic string, body []byte) {
				require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(watermill.NewUUID(), body)))
			},
		}
	})
}
