package cli_test

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/internal/cli"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// TestConsumersView: the view names each transport's subscription, lists
// a name that is no longer declared but still has pending dead letters
// (and not one with marks alone), and ends with the outbox's oldest
// unsent row.
func TestConsumersView(t *testing.T) {
	t.Parallel()
	decls := []handlers.Declaration{{Name: "shop.mail", Types: []string{"shop.order.placed", "shop.order.paid"}}}
	oldest := time.Now().Add(-time.Hour)
	rec := driver.ConsumersRecord{
		Consumers: []driver.ConsumerFigures{
			{Consumer: "shop.mail", Processed: 7},
			{Consumer: "shop.old-mail", PendingDeadLetters: 2},
			{Consumer: "shop.gone", Processed: 3},
		},
		Unsent:       4,
		OldestUnsent: oldest,
	}
	for transport, sub := range map[string]string{
		app.TransportAMQP:     "amqp queue shop.mail",
		app.TransportSQLite:   "sqlite group shop.mail",
		app.TransportPostgres: "postgres group shop.mail",
		app.TransportMemory:   "memory",
	} {
		cfg := app.Config{Transport: transport}
		v := cli.NewConsumersView(cli.Config{Transport: cfg.Transport, Settings: cfg.Settings}, decls, rec)
		require.Len(t, v.Consumers, 2, transport)
		var out bytes.Buffer
		require.NoError(t, cli.PrintConsumers(&out, v))
		concurrency := "128"
		if transport == app.TransportSQLite {
			concurrency = "256"
		}
		require.Regexp(t, `(?m)^shop\.mail\s+shop\.order\.placed,shop\.order\.paid\s+`+sub+`\s+`+concurrency+`\s+32\s+on\s+7\s+0\s+0\s+\?\s+\?$`, out.String(), "what waits not counted: unknown")
		require.Regexp(t, `(?m)^shop\.old-mail\s+\(not declared\)\s+-\s+-\s+-\s+-\s+0\s+2\s+0\s+-\s+-$`, out.String())
		require.NotContains(t, out.String(), "shop.gone")
		require.Regexp(t, `(?m)^outbox: 4 unsent, the oldest added `+oldest.UTC().Format(time.RFC3339Nano)+` \(1h0m\d+s ago\)$`, out.String())
	}
}

// TestConsumersSaysWhyNotCounted: a count of what waits that failed (a
// broker down) shows "?" in the table, and the reason on a line of the
// consumer's after it, which --json alone said before.
func TestConsumersSaysWhyNotCounted(t *testing.T) {
	t.Parallel()
	decls := []handlers.Declaration{{Name: "shop.mail", Types: []string{"shop.order.placed"}}}
	cfg := app.Config{Transport: app.TransportAMQP}
	v := cli.NewConsumersView(cli.Config{Transport: cfg.Transport, Settings: cfg.Settings}, decls, driver.ConsumersRecord{})
	cli.SetLagError(&v, 0, "amqp: dial tcp 127.0.0.1:1: connect: connection refused\x1b[31m")
	var out bytes.Buffer
	require.NoError(t, cli.PrintConsumers(&out, v))
	require.Regexp(t, `(?m)^shop\.mail\s.*\?\s+\?$`, out.String())
	require.Contains(t, out.String(), "shop.mail: WAITING and OLDEST not counted: amqp: dial tcp 127.0.0.1:1: connect: connection refused")
	require.NotContains(t, out.String(), "\x1b", "the reason's control characters are escaped")
}

// TestUnknownEventWriteFails: events show of an event with no record
// fails when its output cannot be written (a full disk), as every other
// view does, instead of exiting 0 with nothing written.
func TestUnknownEventWriteFails(t *testing.T) {
	t.Parallel()
	require.ErrorIs(t, cli.PrintUnknownEvent(failingWriter{}), errFull)
	var out bytes.Buffer
	require.NoError(t, cli.PrintUnknownEvent(&out))
	require.Contains(t, out.String(), "no record of event")
}

var errFull = errors.New("no space left on device")

// failingWriter fails every write, as a full disk does.
type failingWriter struct{}

func (failingWriter) Write([]byte) (int, error) { return 0, errFull }
