package app_test

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// partitionedConfig is postgresConfig with the widget consumer in n
// partitions.
func partitionedConfig(t *testing.T, n int) app.Config {
	t.Helper()
	cfg := postgresConfig(t)
	cfg.Consumers = map[string]middleware.Settings{consumerName: {Partitions: n}}
	return cfg
}

// widgetConsumer registers the widget consumer as name, its statement
// bound for the database's placeholders.
func widgetConsumer(name string) fx.Option {
	return handlers.Register(name, handlers.On(widgetAdded, newAddWidgetRebound))
}

// startService builds and starts the service of cfg with the consumer
// that register registers, and returns it with the function that stops
// it (once; the test's end stops it otherwise).
func startService(t *testing.T, cfg app.Config, register fx.Option, opts ...fx.Option) (*bundle, func()) {
	t.Helper()
	b := &bundle{cfg: cfg}
	b.service = app.New(
		register,
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
		fx.Options(opts...),
		fx.Populate(&b.db, &b.transport, &b.http),
	)
	require.NoError(t, b.service.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(t, b.service.Start(ctx))
	stopped := false
	stop := func() {
		t.Helper()
		if stopped {
			return
		}
		stopped = true
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, b.service.Stop(ctx))
	}
	t.Cleanup(stop)
	return b, stop
}

// partitionsJSON is what the test reads of the consumers command's JSON.
type partitionsJSON struct {
	Consumers []struct {
		Name       string `json:"name"`
		Partitions *struct {
			Count        int      `json:"count"`
			Configured   int      `json:"configured"`
			Members      []string `json:"members"`
			BacklogError string   `json:"backlog_error"`
			Partitions   []struct {
				Partition      int      `json:"partition"`
				Owner          string   `json:"owner"`
				Token          int64    `json:"token"`
				LeaseExpiresIn *float64 `json:"lease_expires_in_seconds"`
				Waiting        *int64   `json:"waiting"`
				Positions      []struct {
					Topic  string `json:"topic"`
					Offset *int64 `json:"offset"`
				} `json:"positions"`
			} `json:"partitions"`
		} `json:"partitions"`
	} `json:"consumers"`
}

// TestPartitionsOperable drives a partitioned consumer on PostgreSQL
// through the operator's commands and the metrics: the consumers command
// lists its partitions, owned by the running process, with nothing
// waiting; /metrics has their leases and backlogs; consumers repartition
// refuses while the process runs, then while messages wait (the consumer
// stopped, events published), and records the new count once they are
// handled and the process stopped; the service then refuses to start
// with the old count.
func TestPartitionsOperable(t *testing.T) {
	t.Parallel()
	const n = 4
	cfg := partitionedConfig(t, n)
	command := func(args ...string) (string, error) {
		t.Helper()
		return runCommand(t, commandOptions(cfg), args...)
	}
	consumers := func() partitionsJSON {
		t.Helper()
		out, err := command("consumers", "--json")
		require.NoError(t, err)
		var v partitionsJSON
		require.NoError(t, json.Unmarshal([]byte(out), &v))
		require.Len(t, v.Consumers, 1)
		require.NotNil(t, v.Consumers[0].Partitions, "%s", out)
		return v
	}
	waiting := func(v partitionsJSON) (sum int64) {
		for _, p := range v.Consumers[0].Partitions.Partitions {
			require.NotNil(t, p.Waiting, "counted")
			sum += *p.Waiting
		}
		return sum
	}

	b, stop := startService(t, cfg, widgetConsumer(consumerName))
	for i := range 20 {
		b.publish(t, fmt.Sprintf("w-%d", i), "gear")
	}
	waitFor(t, "the 20 widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 20 })
	var member string
	waitFor(t, "every partition owned, nothing waiting", func() bool {
		v := consumers()
		p := v.Consumers[0].Partitions
		if len(p.Members) != 1 || waiting(v) != 0 {
			return false
		}
		member = p.Members[0]
		for _, pp := range p.Partitions {
			if pp.Owner != member {
				return false
			}
		}
		return true
	})
	v := consumers().Consumers[0].Partitions
	require.Equal(t, n, v.Count)
	require.Equal(t, n, v.Configured)
	require.Empty(t, v.BacklogError)
	require.Len(t, v.Partitions, n)
	for i, p := range v.Partitions {
		require.Equal(t, i, p.Partition)
		require.Positive(t, p.Token)
		require.NotNil(t, p.LeaseExpiresIn)
		require.Positive(t, *p.LeaseExpiresIn)
		require.Len(t, p.Positions, 2, "the widget type and the replay topic")
	}

	out, err := command("consumers")
	require.NoError(t, err)
	t.Log(out)
	require.Contains(t, out, fmt.Sprintf("consumer %s: 4 partitions, 1 live process: %s\n", consumerName, member))
	require.Regexp(t, `(?m)^PARTITION\s+OWNER\s+TOKEN\s+LEASE EXPIRES IN\s+WAITING\s+POSITION$`, out)
	for p := range n {
		require.Regexp(t, fmt.Sprintf(`(?m)^%d\s+%s\s+\d+\s+\d+s\s+0\s+%s@\d+ replay@\d+$`, p, regexp.QuoteMeta(member), regexp.QuoteMeta(widgetAdded.Type())), out)
	}

	waitFor(t, "the partitions' gauges", func() bool {
		m := metrics(t, b)
		for p := range n {
			if !strings.Contains(m, fmt.Sprintf(`effectively_partition_leases{consumer="%s",owner="%s",partition="%d"} 1`+"\n", consumerName, member, p)) ||
				!strings.Contains(m, fmt.Sprintf(`effectively_partition_backlog{consumer="%s",partition="%d"} 0`+"\n", consumerName, p)) {
				return false
			}
		}
		return true
	})

	_, err = command("consumers", "repartition", consumerName, "8")
	require.ErrorContains(t, err, "refused: 1 process of the consumer is alive ("+member+")")

	stop()
	// Published by a producer of its own: the service's transport is
	// closed.
	db, err := postgres.Open(context.Background(), cfg.DatabaseURL, postgres.OpenConfig{MaxOpenConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	producer, err := postgres.New(context.Background(), db, postgres.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = producer.Close() })
	for i := range 10 {
		(&bundle{transport: producer}).publish(t, fmt.Sprintf("late-%d", i), "gear")
	}
	v = consumers().Consumers[0].Partitions
	require.Empty(t, v.Members, "the process left")
	for _, p := range v.Partitions {
		require.Empty(t, p.Owner, "partition %d: its lease was released", p.Partition)
	}
	require.EqualValues(t, 10, waiting(consumers()), "the events published while the consumer was stopped wait")
	_, err = command("consumers", "repartition", consumerName, "8")
	require.ErrorContains(t, err, "refused: messages wait in partitions ")
	require.ErrorContains(t, err, "of 4: stop the consumer's producers")

	b, stop = startService(t, cfg, widgetConsumer(consumerName))
	waitFor(t, "the 30 widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 30 })
	waitFor(t, "nothing waiting", func() bool { return waiting(consumers()) == 0 })
	stop()
	out, err = command("consumers", "repartition", consumerName, "8")
	require.NoError(t, err)
	require.Equal(t, "consumer "+consumerName+": 8 partitions recorded (it ran with 4). Next: set partitions: 8 for it in the service's configuration (it says 4 now), then start its processes, then its producers.\n", out)
	v = consumers().Consumers[0].Partitions
	require.Equal(t, 8, v.Count)
	require.Equal(t, 4, v.Configured)
	out, err = command("consumers")
	require.NoError(t, err)
	require.Contains(t, out, "consumer "+consumerName+": 8 partitions (configured: 4; the service refuses to start until the consumers repartition "+consumerName+" 4 command), no live process\n")

	out, err = command("consumers", "repartition", consumerName, "8")
	require.NoError(t, err)
	require.Equal(t, "consumer "+consumerName+" runs with 8 partitions already: nothing to do\n", out)
	_, err = command("consumers", "repartition", consumerName, "65")
	require.ErrorContains(t, err, "want a number of partitions from 1 to 64")
	_, err = command("consumers", "repartition", "nobody", "2")
	require.ErrorContains(t, err, "no consumer named nobody is declared in this service (declared: "+consumerName+")")

	refused := app.New(widgetConsumer(consumerName), fx.Supply(widgetMigrations), fx.Replace(cfg))
	require.NoError(t, refused.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.ErrorContains(t, refused.Start(ctx), "run the consumers repartition "+consumerName+" 4 command")
}

// TestPartitionsOnAMQP: the consumers command connects to RabbitMQ to
// count what waits in a partitioned consumer's queues: nothing once its
// events are handled, and no position (a queue keeps none).
func TestPartitionsOnAMQP(t *testing.T) {
	t.Parallel()
	const n = 2
	cfg := amqpConfig(t)
	name := "widgets.parts-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg.Consumers = map[string]middleware.Settings{name: {Partitions: n}}
	t.Cleanup(func() { deleteAMQPPartitions(t, cfg.AMQPURL, name, n) })
	b, _ := startService(t, cfg, widgetConsumer(name))
	for i := range 6 {
		b.publish(t, fmt.Sprintf("w-%d", i), "gear")
	}
	waitFor(t, "the 6 widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 6 })
	opts := fx.Options(widgetConsumer(name), fx.Supply(widgetMigrations), fx.Replace(cfg))
	var out string
	waitFor(t, "both partitions owned, nothing waiting", func() bool {
		var err error
		out, err = runCommand(t, opts, "consumers")
		require.NoError(t, err)
		return regexp.MustCompile(`(?m)^0\s+\S+-\d+-[0-9a-f]+\s+\d+\s+\d+s\s+0\s+-$`).MatchString(out) &&
			regexp.MustCompile(`(?m)^1\s+\S+-\d+-[0-9a-f]+\s+\d+\s+\d+s\s+0\s+-$`).MatchString(out)
	})
	t.Log(out)
	require.Contains(t, out, "consumer "+name+": 2 partitions, 1 live process: ")
	require.Contains(t, out, " amqp queue "+name+".p00..p01 ", "a queue per partition")
}

// deleteAMQPPartitions deletes the queues and the exchange of consumer's
// n partitions from the broker at url.
func deleteAMQPPartitions(t *testing.T, url, consumer string, n int) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("delete the partitions of %s: %v", consumer, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete the partitions of %s: %v", consumer, err)
		return
	}
	for i := range n {
		if _, err := ch.QueueDelete(fmt.Sprintf("%s.p%02d", consumer, i), false, false, false); err != nil {
			t.Logf("delete the partitions of %s: %v", consumer, err)
		}
	}
	if err := ch.ExchangeDelete(consumer+".partitions", false, false); err != nil {
		t.Logf("delete the partitions of %s: %v", consumer, err)
	}
}
