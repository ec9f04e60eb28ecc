package transporttest_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestSQLite runs the suite on the SQLite transport. A plain client
// inserts rows into its messages table by hand.
func TestSQLite(t *testing.T) {
	t.Parallel()
	transporttest.Exercise(t, sqliteEnv)
}

// TestSQLiteAdoptGroup runs the renamed consumer's case on the SQLite
// transport.
func TestSQLiteAdoptGroup(t *testing.T) {
	t.Parallel()
	transporttest.ExerciseAdoptGroup(t, sqliteEnv)
}

// sqliteEnv is an Env on a SQLite transport of a file of the test's own.
func sqliteEnv(t *testing.T) *transporttest.Env {
	db, err := sqlite.Open(context.Background(), testenv.SQLitePath(t), sqlite.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	tr, err := sqlite.New(db, sqlite.TransportConfig{Subscriber: sqlite.SubscriberConfig{
		PollInterval:  20 * time.Millisecond,
		NackDelay:     20 * time.Millisecond,
		LeaseDuration: 30 * time.Second,
	}})
	require.NoError(t, err)
	return &transporttest.Env{
		Transport:      tr,
		SettleReported: true,
		PublishRaw: func(t *testing.T, topic string, body []byte) {
			_, err := db.Exec(`INSERT INTO pubsub_messages (topic, payload) VALUES (?, ?)`, topic, body)
			require.NoError(t, err)
		},
		PublishRow: func(_ *testing.T, topic string, body []byte, metadata string) error {
			_, err := db.Exec(`INSERT INTO pubsub_messages (topic, payload, metadata) VALUES (?, ?, ?)`, topic, body, metadata)
			return err
		},
	}
}
