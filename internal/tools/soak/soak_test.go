package soak_test

import (
	"context"
	"errors"
	"os"
	"os/user"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/tools/soak"
)

// TestSoak is the short soak of make test: 2,000 events through the
// outbox and the tests' RabbitMQ node, the consumers killed at random,
// the soak's own PostgreSQL restarted once. It needs root and Debian's
// PostgreSQL 15 and RabbitMQ; without them it is skipped, unless CI=true.
// EFFECTIVELY_SOAK_SEED runs the plan of a given seed (the run logs its
// own).
func TestSoak(t *testing.T) {
	url := os.Getenv("EFFECTIVELY_TEST_AMQP_URL")
	if url == "" {
		missing(t, "EFFECTIVELY_TEST_AMQP_URL is not set (make test sets it)")
	}
	if u, err := user.Current(); err != nil || u.Uid != "0" {
		missing(t, "the soak runs its servers as the postgres user: it needs root")
	}
	seed := uint64(time.Now().UnixNano())
	if s := os.Getenv("EFFECTIVELY_SOAK_SEED"); s != "" { // to run a failed plan again
		var err error
		seed, err = strconv.ParseUint(s, 10, 64)
		require.NoError(t, err, "EFFECTIVELY_SOAK_SEED")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	report, err := soak.Run(ctx, soak.Options{
		Events:    2000,
		Seed:      seed,
		Rate:      100,
		AMQPURL:   url,
		KillEvery: [2]time.Duration{2 * time.Second, 4 * time.Second},
		Settle:    2 * time.Minute,
		Log:       testWriter{t},
	})
	if errors.Is(err, soak.ErrMissing) {
		missing(t, err.Error())
	}
	require.NoError(t, err)
	report.Print(testWriter{t})
	require.NoError(t, report.Check())
	require.NotZero(t, report.Kills, "no consumer was killed")
}

func missing(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatal(why)
	}
	t.Skip(why)
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}
