package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"

	wamqp "github.com/ThreeDotsLabs/watermill-amqp/v3/pkg/amqp"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	amqp091 "github.com/rabbitmq/amqp091-go"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/postgres"
)

// outboxScenario: the framework's outbox relay draining PostgreSQL to
// RabbitMQ, against watermill-amqp's publisher alone.
func outboxScenario() Scenario {
	return Scenario{
		Name:  "outbox",
		Title: "Outbox relay to RabbitMQ",
		About: "The framework's `outbox.Relay`, in a process of its own, drains the outbox table of a PostgreSQL " +
			"schema (filled beforehand with distinct events through `outbox.AddTx`, 500 to a transaction) to " +
			"RabbitMQ through the AMQP transport's publisher, as the example service runs it: batches of up to " +
			"1,000 rows locked `FOR UPDATE SKIP LOCKED`, published with pipelined publisher confirms on one " +
			"channel, each row marked sent once its own confirm came, one UPDATE per batch, the next batch " +
			"read and published while the previous one's confirms arrive. The baseline is watermill-amqp's publisher with `ConfirmDelivery` " +
			"publishing the same messages, read from a file beforehand, one `Publish` each, with the transport's " +
			"pool of 8 open channels (watermill-amqp's default, no pool, opens a channel for every `Publish` and " +
			"reached about 1,440 messages/s here): no database at all. The broker's limit is amqp091-go's publisher " +
			"alone, as a hand-tuned relay with nothing to read or mark would publish: the same messages from the file, with the " +
			"transport's headers, on one channel, up to 1,000 unconfirmed; it says how fast RabbitMQ takes and delivers " +
			"them on this machine with no database, the ceiling of any relay here. " +
			"An effect is a message received from a queue of the run's own bound to the type's exchange; " +
			"effects/s runs from the first received to the last. In the latency phase a process of its own " +
			"adds one event per transaction with `outbox.AddTx` (which wakes its relay) or publishes it, at half " +
			"the drain rate; latency runs from the add (or publish) to the message's arrival. " +
			"Gate: the relay at least 0.85 of the broker's limit.",
		Needs: []Need{NeedPostgres, NeedAMQP},
		Runs: []Run{
			{Name: outboxRelay, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutbox(ctx, env, relayRun{})
			}},
			{Name: "watermill-amqp publisher, ConfirmDelivery", Baseline: true, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutbox(ctx, env, publisherRun{name: "publisher"})
			}},
			{Name: outboxLimit, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureOutbox(ctx, env, publisherRun{name: "raw"})
			}},
		},
		Gate: &Gate{Run: outboxRelay, Of: outboxLimit, Min: RelayLimitGate},
		Children: []Child{
			{Name: "relay", Main: relayMain},
			{Name: "publisher", Main: publisherMain},
			{Name: "raw", Main: rawPublisherMain},
		},
	}
}

// The outbox scenario's runs that its gate names.
const (
	outboxRelay = "outbox relay, AMQP transport's publisher"
	outboxLimit = "broker's limit: amqp091-go publisher, 1,000 confirms in flight"
)

// The outbox scenario's child variables.
const (
	envOutboxDB       = "EFFECTIVELY_BENCH_DATABASE_URL"
	envOutboxAMQP     = "EFFECTIVELY_BENCH_AMQP_URL"
	envOutboxType     = "EFFECTIVELY_BENCH_EVENT_TYPE"
	envOutboxMessages = "EFFECTIVELY_BENCH_MESSAGES" // id TAB body, a line each
	envOutboxRate     = "EFFECTIVELY_BENCH_RATE"     // set: the latency phase, at that rate
	envOutboxSent     = "EFFECTIVELY_BENCH_SENT"     // where the latency phase writes its send times
)

// outboxRun is what differs between the relay and its baseline: how the
// messages reach the publishing child.
type outboxRun interface {
	// child is the name of the child that publishes.
	child() string
	// prepare makes the drain's messages ready for the child; db is the
	// run's schema.
	prepare(ctx context.Context, db *sqlx.DB, msgs []Message) error
}

// relayRun puts the messages in the outbox table.
type relayRun struct{}

func (relayRun) child() string { return "relay" }

func (relayRun) prepare(ctx context.Context, db *sqlx.DB, msgs []Message) error {
	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
		return err
	}
	box, err := outbox.New(db, outbox.Config{})
	if err != nil {
		return err
	}
	for len(msgs) > 0 {
		n := min(500, len(msgs))
		if err := addBatch(ctx, db, box, msgs[:n]); err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// publisherRun needs nothing but the messages' file; name is its child.
type publisherRun struct{ name string }

func (r publisherRun) child() string { return r.name }

func (publisherRun) prepare(context.Context, *sqlx.DB, []Message) error { return nil }

// addBatch adds msgs to the outbox in one transaction.
func addBatch(ctx context.Context, db *sqlx.DB, box *outbox.Outbox, msgs []Message) error {
	return inTx(ctx, db, func(tx *sqlx.Tx) error {
		for _, m := range msgs {
			env, err := framework.Decode(m.Body, 0)
			if err != nil {
				return fmt.Errorf("decode %s: %w", m.ID, err)
			}
			if err := box.AddTx(ctx, tx, env); err != nil {
				return fmt.Errorf("add %s: %w", m.ID, err)
			}
		}
		return nil
	})
}

// outboxMessages returns n distinct events of type typ whose ids start
// with prefix.
func outboxMessages(prefix, typ string, n int) []Message {
	msgs := Events(prefix, n)
	for i := range msgs {
		var ev cloudEvent
		if err := json.Unmarshal(msgs[i].Body, &ev); err != nil {
			panic(err) // NewMessage wrote it
		}
		ev.Type = typ
		body, err := json.Marshal(ev)
		if err != nil {
			panic(err) // a struct of strings and times always marshals
		}
		msgs[i].Body = body
	}
	return msgs
}

// measureOutbox measures one publisher: it prepares the messages, starts
// the child, begins it and times the messages' arrival in a queue of the
// run's own; then, outside a smoke run, a second child sends fresh events
// at half that rate for their latency.
func measureOutbox(ctx context.Context, env *Env, run outboxRun) (Result, error) {
	url, db, err := openSchema(ctx, env)
	if err != nil {
		return Result{}, err
	}
	// A type, so an exchange, of the run's own: no other queue gets the
	// messages.
	typ := "bench.outbox." + env.ID
	sink, err := newAMQPSink(ctx, env, typ)
	if err != nil {
		return Result{}, err
	}
	msgs := outboxMessages(env.ID+"-b", typ, env.Events)
	env.Logf("preparing %d messages", len(msgs))
	if err := run.prepare(ctx, db, msgs); err != nil {
		return Result{}, fmt.Errorf("prepare: %w", err)
	}
	vars := map[string]string{envOutboxDB: url, envOutboxAMQP: env.AMQPURL, envOutboxType: typ}
	if vars[envOutboxMessages], err = writeMessages(env.Dir, "drain", msgs); err != nil {
		return Result{}, err
	}
	p, err := env.StartChild(ctx, run.child(), vars)
	if err != nil {
		return Result{}, err
	}
	mallocs, cpu, err := beginDrain(ctx, p, len(msgs), func(ctx context.Context) error {
		if err := sink.wait(ctx, env, p, msgs); err != nil {
			return fmt.Errorf("drain: %w", err)
		}
		return nil
	})
	if err != nil {
		return Result{}, err
	}
	res := Result{Events: len(msgs), Messages: len(msgs), Drained: len(msgs), AllocsPerMessage: mallocs / float64(len(msgs))}
	res.Elapsed = sink.span(msgs)
	res.CPU = cpu
	env.Logf("published %d at %.0f/s", res.Drained, res.EffectsPerSecond())
	if res.PeakRSS, err = p.PeakRSS(); err != nil {
		return Result{}, err
	}
	if err := p.Stop(stopTimeout); err != nil {
		return Result{}, err
	}
	if res.Profile, err = ProfileTop(ctx, p.ProfilePath(), 10); err != nil {
		return Result{}, err
	}

	if !env.Smoke && res.EffectsPerSecond() > 0 {
		lat, err := outboxLatency(ctx, env, run, sink, vars, typ, res.EffectsPerSecond()/2)
		if err != nil {
			return Result{}, fmt.Errorf("latency: %w", err)
		}
		res.Latency = lat
		res.Events += lat.Events
		res.Messages += lat.Events
	}
	if res.Effects, res.DistinctEffects, err = sink.count(ctx, env.ID); err != nil {
		return Result{}, err
	}
	return res, nil
}

// outboxLatency runs the child again in its latency phase: it sends fresh
// events at rate (adds them to the outbox, for the relay) and writes when
// it sent each; the latency is each message's arrival after its send.
func outboxLatency(ctx context.Context, env *Env, run outboxRun, sink *amqpSink, vars map[string]string, typ string, rate float64) (*Latency, error) {
	n := min(env.Events, max(20, int(rate*env.LatencyDuration.Seconds())))
	msgs := outboxMessages(env.ID+"-l", typ, n)
	env.Logf("latency: %d events at %.0f/s", n, rate)
	path, err := writeMessages(env.Dir, "latency", msgs)
	if err != nil {
		return nil, err
	}
	sentPath := filepath.Join(env.Dir, "sent")
	lvars := map[string]string{envOutboxMessages: path, envOutboxRate: strconv.FormatFloat(rate, 'f', -1, 64), envOutboxSent: sentPath}
	for k, v := range vars {
		if _, ok := lvars[k]; !ok {
			lvars[k] = v
		}
	}
	p, err := env.StartChild(ctx, run.child(), lvars)
	if err != nil {
		return nil, err
	}
	if err := p.Begin(ctx); err != nil {
		return nil, err
	}
	if err := sink.wait(ctx, env, p, msgs); err != nil {
		return nil, err
	}
	if err := p.Stop(stopTimeout); err != nil {
		return nil, err
	}
	sent, err := readSent(sentPath)
	if err != nil {
		return nil, err
	}
	ds := make([]time.Duration, 0, n)
	for _, m := range msgs {
		at, ok := sink.received(m.ID)
		s, sok := sent[m.ID]
		if !ok || !sok {
			return nil, fmt.Errorf("no send or arrival time of %s", m.ID)
		}
		ds = append(ds, at.Sub(s))
	}
	return &Latency{Rate: rate, Events: n, P50: Percentile(ds, 50), P99: Percentile(ds, 99)}, nil
}

// writeMessages writes msgs to a file of the run's folder, a line each:
// the id, a tab, the body.
func writeMessages(dir, name string, msgs []Message) (string, error) {
	path := filepath.Join(dir, name+".messages")
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("messages file: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, m := range msgs {
		_, _ = w.WriteString(m.ID)
		_ = w.WriteByte('\t')
		_, _ = w.Write(m.Body)
		_ = w.WriteByte('\n')
	}
	if err := errors.Join(w.Flush(), f.Close()); err != nil {
		return "", fmt.Errorf("messages file: %w", err)
	}
	return path, nil
}

// readMessages reads a file writeMessages wrote.
func readMessages(path string) ([]Message, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, err
	}
	msgs := make([]Message, 0, len(lines))
	for _, l := range lines {
		id, body, ok := bytes.Cut(l, []byte{'\t'})
		if !ok {
			return nil, fmt.Errorf("messages: a line without a tab: %.40q", l)
		}
		msgs = append(msgs, Message{ID: string(id), Body: body})
	}
	return msgs, nil
}

// readSent reads the send times a latency phase wrote: id, a space, Unix
// nanoseconds, a line each.
func readSent(path string) (map[string]time.Time, error) {
	lines, err := readLines(path)
	if err != nil {
		return nil, fmt.Errorf("send times: %w", err)
	}
	sent := make(map[string]time.Time, len(lines))
	for _, l := range lines {
		id, ns, ok := bytes.Cut(l, []byte{' '})
		n, err := strconv.ParseInt(string(ns), 10, 64)
		if !ok || err != nil {
			return nil, fmt.Errorf("send times: bad line %.60q", l)
		}
		sent[string(id)] = time.Unix(0, n)
	}
	return sent, nil
}

// relayMain is the relay's child: the outbox relay of the run's schema,
// publishing through the AMQP transport's publisher, as the runner runs it.
// Begun, it runs until stopped; in the latency phase it also adds the
// messages at the rate given, one per transaction, and writes when.
func relayMain(ctx context.Context, c *ChildEnv) error {
	db, err := postgres.Open(ctx, c.Getenv(envOutboxDB), postgres.OpenConfig{})
	if err != nil {
		return err
	}
	defer db.Close()
	tr, err := amqp.New(amqp.TransportConfig{URL: c.Getenv(envOutboxAMQP)})
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.Connect(ctx); err != nil {
		return err
	}
	pub := tr.Publisher()
	box, err := outbox.New(db, outbox.Config{})
	if err != nil {
		return err
	}
	metrics, err := outbox.NewMetrics(prometheus.NewRegistry())
	if err != nil {
		return err
	}
	relay, err := outbox.NewRelay(db, pub, outbox.RelayConfig{Outbox: box, Metrics: metrics})
	if err != nil {
		return err
	}
	return beginThen(ctx, c, func(ctx context.Context) error { return relay.Run(ctx) },
		func(ctx context.Context, m Message) error { return addBatch(ctx, db, box, []Message{m}) })
}

// publisherMain is the baseline's child: watermill-amqp's publisher with
// ConfirmDelivery and the transport's channel pool. Begun, it publishes
// every message, one Publish each, then waits to be stopped; in the
// latency phase it publishes them at the rate given and writes when.
func publisherMain(ctx context.Context, c *ChildEnv) error {
	cfg := wamqp.NewDurablePubSubConfig(c.Getenv(envOutboxAMQP), nil)
	cfg.Publish.ConfirmDelivery = true
	// The transport's pool of open channels: watermill-amqp's default, no
	// pool, opens and closes a channel for every Publish.
	cfg.Publish.ChannelPoolSize = amqp.DefaultChannelPoolSize
	pub, err := wamqp.NewPublisher(cfg, quietLogger())
	if err != nil {
		return fmt.Errorf("publisher: %w", err)
	}
	defer pub.Close()
	typ := c.Getenv(envOutboxType)
	publish := func(_ context.Context, m Message) error {
		return pub.Publish(typ, message.NewMessage(m.ID, m.Body))
	}
	work, err := publishWork(c, func(ctx context.Context, msgs []Message) error {
		for _, m := range msgs {
			if err := publish(ctx, m); err != nil {
				return fmt.Errorf("publish %s: %w", m.ID, err)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return beginThen(ctx, c, work, publish)
}

// publishWork returns the work of a publishing child (see beginThen). In
// the drain, it publishes every message of the child's file with drain,
// the file read now, before the begin, so that the drain's allocations
// count the publishing only; then it waits to be stopped. In the latency
// phase the child publishes through its send alone, and the work only
// waits.
func publishWork(c *ChildEnv, drain func(context.Context, []Message) error) (func(context.Context) error, error) {
	if c.Getenv(envOutboxRate) != "" {
		return func(ctx context.Context) error {
			<-ctx.Done()
			return nil
		}, nil
	}
	msgs, err := readMessages(c.Getenv(envOutboxMessages))
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context) error {
		if err := drain(ctx, msgs); err != nil {
			return err
		}
		<-ctx.Done()
		return nil
	}, nil
}

// rawWindow is how many publishings the broker's limit keeps
// unconfirmed.
const rawWindow = 1000

// rawPublisherMain is the broker's limit: amqp091-go's publisher with no
// database and no framework, publishing every message with the AMQP
// transport's headers and properties on one channel in confirm mode,
// with up to rawWindow unconfirmed. Begun, it publishes them all, then
// waits to be stopped; in the latency phase it publishes each at the rate
// given and waits for its confirm.
func rawPublisherMain(ctx context.Context, c *ChildEnv) error {
	conn, err := amqp091.Dial(c.Getenv(envOutboxAMQP))
	if err != nil {
		return fmt.Errorf("dial RabbitMQ: %w", err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("channel: %w", err)
	}
	if err := ch.Confirm(false); err != nil {
		return fmt.Errorf("confirm mode: %w", err)
	}
	typ := c.Getenv(envOutboxType)
	publish := func(ctx context.Context, m Message) (*amqp091.DeferredConfirmation, error) {
		msg := message.NewMessage(m.ID, m.Body)
		msg.Metadata.Set(framework.MetadataContentType, framework.ContentType)
		p, err := amqp.Marshaler{}.Marshal(msg) // the transport's publishing
		if err != nil {
			return nil, err
		}
		return ch.PublishWithDeferredConfirmWithContext(ctx, typ, "", false, false, p)
	}
	confirmed := func(ctx context.Context, dc *amqp091.DeferredConfirmation) error {
		ok, err := dc.WaitContext(ctx)
		if err != nil {
			return fmt.Errorf("confirm %d: %w", dc.DeliveryTag, err)
		}
		if !ok {
			return fmt.Errorf("publishing %d nacked by the broker", dc.DeliveryTag)
		}
		return nil
	}
	send := func(ctx context.Context, m Message) error {
		dc, err := publish(ctx, m)
		if err != nil {
			return fmt.Errorf("publish %s: %w", m.ID, err)
		}
		return confirmed(ctx, dc)
	}
	work, err := publishWork(c, func(ctx context.Context, msgs []Message) error {
		// A ring of the unconfirmed, oldest at i % rawWindow: the broker
		// confirms in order.
		window := make([]*amqp091.DeferredConfirmation, rawWindow)
		for i, m := range msgs {
			if dc := window[i%rawWindow]; dc != nil {
				if err := confirmed(ctx, dc); err != nil {
					return err
				}
			}
			dc, err := publish(ctx, m)
			if err != nil {
				return fmt.Errorf("publish %s: %w", m.ID, err)
			}
			window[i%rawWindow] = dc
		}
		for _, dc := range window {
			if dc != nil {
				if err := confirmed(ctx, dc); err != nil {
					return err
				}
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return beginThen(ctx, c, work, send)
}

// beginThen says the child is ready, waits for the begin, and then runs
// work until ctx ends. In the latency phase (envOutboxRate set) it also
// sends the messages of envOutboxMessages at that rate with send, while
// work runs, and writes when it sent each to envOutboxSent.
func beginThen(ctx context.Context, c *ChildEnv, work func(context.Context) error, send func(context.Context, Message) error) error {
	var paced []Message
	var rate float64
	if r := c.Getenv(envOutboxRate); r != "" {
		var err error
		if rate, err = strconv.ParseFloat(r, 64); err != nil || rate <= 0 {
			return fmt.Errorf("%s: want a positive rate, got %q", envOutboxRate, r)
		}
		if paced, err = readMessages(c.Getenv(envOutboxMessages)); err != nil {
			return err
		}
	}
	c.Ready()
	if err := c.WaitBegin(ctx); err != nil {
		return nil // stopped before it began
	}
	if paced == nil {
		return work(ctx)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- work(ctx) }()
	sent, err := Pace(ctx, rate, paced, send)
	if err != nil {
		return err
	}
	if err := writeSent(c.Getenv(envOutboxSent), paced, sent); err != nil {
		return err
	}
	select {
	case <-ctx.Done():
	case err := <-errc:
		return err
	}
	cancel()
	return <-errc
}

// writeSent writes when each message was sent, for readSent.
func writeSent(path string, msgs []Message, sent []time.Time) error {
	var b bytes.Buffer
	for i, m := range msgs {
		fmt.Fprintf(&b, "%s %d\n", m.ID, sent[i].UnixNano())
	}
	if err := os.WriteFile(path, b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("send times: %w", err)
	}
	return nil
}
