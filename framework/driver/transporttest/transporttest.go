package transporttest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// Env is one case's transport and the hooks to publish as a plain client.
// Build a fresh one per call of the Exercise's open function; the suite
// closes the transport.
type Env struct {
	// Transport is the transport under test, built by its package's New
	// (and connected, where it connects). Required.
	Transport driver.Transport
	// PublishRaw publishes body to topic the way a plain client of the
	// broker or database would, without watermill. Required.
	PublishRaw func(t *testing.T, topic string, body []byte)
	// PublishRow inserts a message row into topic's table as a plain SQL
	// client would, with metadata as its stored text, and returns the
	// database's error. Set it on transports that store metadata as JSON
	// text (the SQL transports): the catalog's rows with metadata that is
	// not a JSON object of strings need it.
	PublishRow func(t *testing.T, topic string, body []byte, metadata string) error
	// PublishHeaders publishes body to topic as a plain client of the
	// broker would, with headers of any type (see BadInput.Headers). Set
	// it on transports whose headers are typed (AMQP).
	PublishHeaders func(t *testing.T, topic string, body []byte, headers map[string]any)
	// StoresJSON says that the transport keeps payloads and metadata in
	// JSON columns (PostgreSQL's json): a body or metadata that is not
	// JSON text in UTF-8 is refused at publish and never reaches a
	// subscriber.
	StoresJSON bool
	// SettleReported says that the transport watches no message it hands
	// out when its reader reports each message's outcome, as the runner
	// does (driver.SubscribeConfig.Settles, driver.Settler): the suite
	// then checks that holding messages in flight costs the transport no
	// goroutine each.
	SettleReported bool
	// Timeout bounds each wait of the suite. Defaults to 60s.
	Timeout time.Duration
}

// Exercise runs every case of the suite, each on an Env of its own from
// open, in parallel.
func Exercise(t *testing.T, open func(t *testing.T) *Env) {
	t.Helper()
	cases := []struct {
		name string
		run  func(t *testing.T, s *suite)
	}{
		{"Deliver", caseDeliver},
		{"NackRedelivers", caseNackRedelivers},
		{"InitializeKeeps", caseInitializeKeeps},
		{"Replay", caseReplay},
		{"Ready", caseReady},
		{"Close", caseClose},
		{"PlainClient", casePlainClient},
		{"BadInputs", caseBadInputs},
		{"Reported", caseReported},
		{"Hold", caseHold},
		{"PublishedAt", casePublishedAt},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newSuite(t, open(t)))
		})
	}
}

// ExerciseServerRestart publishes a backlog, restarts the server while a
// subscriber drains it (restart must return once the server is back), and
// checks that every message was delivered, intact, and acknowledged: the
// subscription recovers by itself and loses nothing.
func ExerciseServerRestart(t *testing.T, env *Env, restart func(t *testing.T)) {
	t.Helper()
	s := newSuite(t, env)
	s.slow = 20 * time.Millisecond
	const n = 200
	// The subscription binds its queue or group first, as a consumer does
	// at start.
	name := s.consumer("drain")
	p := s.start(t, name, 2, nil, s.topic("a"))
	defer p.stop()
	sent := s.publishN(t, s.topic("a"), "drain", n)
	s.waitFor(t, "10 messages acknowledged", func() bool { return len(s.ackedOf(name)) >= 10 })
	restart(t)
	s.waitAcked(t, name, sent)
	s.requireIntact(t, name, sent)
}

// sent is a message the suite published: its payload, which is distinct,
// and its metadata.
type sent struct {
	payload  string
	metadata map[string]string
}

// delivery is a message as a subscriber received it.
type delivery struct {
	consumer string
	payload  string
	metadata message.Metadata
	call     int       // how many times this consumer received the payload, this one included
	at       time.Time // when the handler received it
}

// suite is one case's state.
type suite struct {
	env *Env
	id  string // unique per case: names its topics and consumers

	// behave decides whether a handler acks (nil) or nacks a delivery.
	behave atomic.Pointer[func(d delivery) error]
	slow   time.Duration

	mu        sync.Mutex
	delivered map[string][]delivery      // consumer → every delivery
	acked     map[string]map[string]bool // consumer → payloads acknowledged
}

func newSuite(t *testing.T, env *Env) *suite {
	t.Helper()
	require.NotNil(t, env.Transport, "Env.Transport")
	t.Cleanup(func() { _ = env.Transport.Close() })
	if env.Timeout == 0 {
		env.Timeout = 60 * time.Second
	}
	return &suite{
		env:       env,
		id:        randomHex(6),
		delivered: make(map[string][]delivery),
		acked:     make(map[string]map[string]bool),
	}
}

// topic returns the case's topic (event type) for role.
func (s *suite) topic(role string) string { return "transporttest.t" + s.id + "." + role }

// consumer returns the case's consumer name for role.
func (s *suite) consumer(role string) string { return "tt-" + s.id + "." + role }

// process is one running subscription: a router with a plain handler per
// topic of the subscription.
type process struct {
	router *message.Router
	sub    message.Subscriber
	done   chan struct{}
	once   sync.Once
	// label is the value of the profiler label "transporttest" that the
	// goroutines of the router and of its subscription inherit.
	label string
}

// start subscribes the consumer named name to types through the Env's
// Transport, with concurrency messages in flight, binds the subscription
// (Initialize), calls bound (when set), then runs a router with a plain
// handler per topic of the subscription until stop or the end of the
// test.
func (s *suite) start(t *testing.T, name string, concurrency int, bound func(), types ...string) *process {
	t.Helper()
	return s.launch(t, name, concurrency, bound, false, types...)
}

// launch is start; with reported, the router runs as the runner runs
// it: subscribed with driver.SubscribeConfig.Settles, each message
// acked or nacked after the handler and its outcome told to the
// subscriber, when that is a driver.Settler.
func (s *suite) launch(t *testing.T, name string, concurrency int, bound func(), reported bool, types ...string) *process {
	t.Helper()
	sub, err := s.env.Transport.Subscribe(driver.SubscribeConfig{Consumer: name, Types: types, Concurrency: concurrency, Settles: reported})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	if bound != nil {
		bound()
	}
	router, err := message.NewRouter(message.RouterConfig{CloseTimeout: 3 * time.Second}, watermill.NopLogger{})
	require.NoError(t, err)
	ctx := context.Background()
	if settler, ok := sub.Subscriber.(driver.Settler); ok && reported {
		router.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
			return func(msg *message.Message) ([]*message.Message, error) {
				out, err := h(msg)
				settler.Settle(msg, pipeline.AckOrNack(msg, err))
				return out, err
			}
		})
	}
	for i, topic := range sub.Topics {
		router.AddConsumerHandler(fmt.Sprintf("%s#%d", name, i), topic, sub.Subscriber, s.handler(name))
	}
	p := &process{router: router, sub: sub.Subscriber, done: make(chan struct{}), label: name + "-" + randomHex(2)}
	go pprof.Do(ctx, pprof.Labels("transporttest", p.label), func(ctx context.Context) {
		defer close(p.done)
		_ = router.Run(ctx)
	})
	select {
	case <-router.Running():
	case <-p.done:
		t.Fatalf("router of %s stopped at start", name)
	case <-time.After(s.env.Timeout):
		t.Fatalf("router of %s did not start", name)
	}
	t.Cleanup(p.stop)
	return p
}

// stop closes the process's router and subscriber.
func (p *process) stop() {
	p.once.Do(func() {
		_ = p.router.Close()
		<-p.done
		_ = p.sub.Close()
	})
}

// handler records each delivery to consumer and acks it, unless the
// suite's behave returns an error: then the router nacks it.
func (s *suite) handler(consumer string) message.NoPublishHandlerFunc {
	return func(msg *message.Message) error {
		d := delivery{consumer: consumer, payload: string(msg.Payload), metadata: maps.Clone(msg.Metadata), at: time.Now()}
		s.mu.Lock()
		for _, prev := range s.delivered[consumer] {
			if prev.payload == d.payload {
				d.call++
			}
		}
		d.call++
		s.delivered[consumer] = append(s.delivered[consumer], d)
		s.mu.Unlock()
		if s.slow > 0 {
			select {
			case <-time.After(s.slow):
			case <-msg.Context().Done():
				return msg.Context().Err()
			}
		}
		if b := s.behave.Load(); b != nil {
			if err := (*b)(d); err != nil {
				return err
			}
		}
		s.mu.Lock()
		if s.acked[consumer] == nil {
			s.acked[consumer] = make(map[string]bool)
		}
		s.acked[consumer][d.payload] = true
		s.mu.Unlock()
		return nil
	}
}

func (s *suite) setBehave(f func(d delivery) error) { s.behave.Store(&f) }

// deliveriesOf returns every delivery of payload to consumer.
func (s *suite) deliveriesOf(consumer, payload string) []delivery {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []delivery
	for _, d := range s.delivered[consumer] {
		if d.payload == payload {
			out = append(out, d)
		}
	}
	return out
}

// ackedOf returns the payloads consumer acknowledged.
func (s *suite) ackedOf(consumer string) map[string]bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.acked[consumer])
}

// newMessage returns a message of m's payload and metadata.
func newMessage(m sent) *message.Message {
	msg := message.NewMessage(watermill.NewUUID(), []byte(m.payload))
	maps.Copy(msg.Metadata, m.metadata)
	return msg
}

// publishN publishes n messages to topic, each with a payload of its own
// (JSON text naming role) and metadata, and returns them.
func (s *suite) publishN(t *testing.T, topic, role string, n int) []sent {
	t.Helper()
	out := make([]sent, n)
	msgs := make([]*message.Message, n)
	for i := range n {
		out[i] = sent{
			payload:  fmt.Sprintf(`{"case":%q,"n":%d}`, role+"-"+s.id, i),
			metadata: map[string]string{"tt-index": fmt.Sprint(i), "tt-note": "ünïcode ✓"},
		}
		msgs[i] = newMessage(out[i])
	}
	for start := 0; start < n; start += 50 {
		require.NoError(t, s.env.Transport.Publisher().Publish(topic, msgs[start:min(start+50, n)]...))
	}
	return out
}

// waitFor polls cond until it holds or the Env's timeout passes.
func (s *suite) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(s.env.Timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", s.env.Timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitAcked waits until consumer acknowledged every message of want.
func (s *suite) waitAcked(t *testing.T, consumer string, want []sent) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("%d messages acknowledged by %s", len(want), consumer), func() bool {
		acked := s.ackedOf(consumer)
		for _, m := range want {
			if !acked[m.payload] {
				return false
			}
		}
		return true
	})
}

// requireIntact checks that every delivery to consumer is one of want,
// with its metadata intact (a transport may add keys of its own), and
// that each of want was delivered, or, when must is given, each of must.
func (s *suite) requireIntact(t *testing.T, consumer string, want []sent, must ...sent) {
	t.Helper()
	byPayload := make(map[string]sent, len(want))
	for _, m := range want {
		byPayload[m.payload] = m
	}
	s.mu.Lock()
	got := append([]delivery(nil), s.delivered[consumer]...)
	s.mu.Unlock()
	seen := make(map[string]bool, len(want))
	for _, d := range got {
		m, ok := byPayload[d.payload]
		require.Truef(t, ok, "%s received a message nobody sent it: %.100q", consumer, d.payload)
		seen[d.payload] = true
		for k, v := range m.metadata {
			require.Equalf(t, v, d.metadata.Get(k), "metadata %q of %s", k, d.payload)
		}
		require.Emptyf(t, d.metadata.Get(framework.MetadataUnreadable), "%s is marked unreadable", d.payload)
	}
	if must == nil {
		must = want
	}
	for _, m := range must {
		require.Truef(t, seen[m.payload], "%s delivered", m.payload)
	}
}

// settle waits a little so that a wrong extra delivery would show.
func settle() { time.Sleep(300 * time.Millisecond) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var errNack = errors.New("nack")

// subscribe subscribes the consumer named name to types through the
// Env's Transport and binds the subscription.
func (s *suite) subscribe(t *testing.T, name string, types ...string) driver.Subscription {
	t.Helper()
	sub, err := s.env.Transport.Subscribe(driver.SubscribeConfig{Consumer: name, Types: types})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	return sub
}
