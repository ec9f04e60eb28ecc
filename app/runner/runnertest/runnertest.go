package runnertest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/middleware"
)

// Env is one case's transport and database. Build a fresh one per call of
// the Exercise's open function; the suite migrates DB and closes the
// transports.
type Env struct {
	// DB holds the stores' tables and the handlers' effects. Required.
	DB *sqlx.DB
	// Store is the framework's store on DB. Required.
	Store driver.Store
	// Process returns the transport of another process of the same
	// service (a connection of its own, say), for the Runner of each
	// process the suite starts; the suite closes it with the process.
	// Defaults to Transport.
	Process func(t *testing.T) driver.Transport
	// Env is the transport under test (Transport, built by its
	// package's New: the suite publishes and replays through it, each
	// Runner it starts consumes through it unless Process is set, and
	// the suite closes it; required) and the hooks to publish as a plain
	// client, as the transport's conformance suite takes them.
	transporttest.Env
}

// Exercise runs every case of the suite, each on an Env of its own from
// open, in parallel: those that need what the transport does not have
// (see Has) are not part of its suite.
func Exercise(t *testing.T, has Has, open func(t *testing.T) *Env) {
	t.Helper()
	cases := []struct {
		name  string
		run   func(t *testing.T, s *suite)
		needs Has
	}{
		{"DeliverOnce", caseDeliverOnce, Has{}},
		{"ConcurrentDuplicates", caseConcurrentDuplicates, Has{}},
		{"Retry", caseRetry, Has{}},
		{"DeadLetters", caseDeadLetters, Has{}},
		{"Replay", caseReplay, Has{}},
		{"Restart", caseRestart, Has{}},
		{"SeveralTypes", caseSeveralTypes, Has{}},
		{"Interop", caseInterop, Has{}},
		{"BadInputs", caseBadInputs, Has{}},
		{"HoldUpFailing", caseHoldUpFailing, Has{}},
		{"HoldUpDying", caseHoldUpDying, Has{}},
		{"Breaker", caseBreaker, Has{}},
		{"StopDuringOutage", caseStopDuringOutage, Has{}},
		{"StopHandsBack", caseStopHandsBack, Has{Partitions: true, Redeliveries: true}},
		{"OrderHotKeys", caseOrderHotKeys, Has{Order: true}},
		{"OrderColdKeys", caseOrderColdKeys, Has{Order: true}},
		{"OrderHotKeysFailing", caseOrderHotKeysFailing, Has{Order: true}},
		{"OrderHotSubject", caseOrderHotSubject, Has{Order: true, Holds: true}},
		{"Partitions", casePartitions, Has{Order: true, Partitions: true}},
		{"Lag", caseLag, Has{Backlogs: true}},
	}
	for _, c := range cases {
		if c.needs.Order && !has.Order || c.needs.Partitions && !has.Partitions || c.needs.Redeliveries && !has.Redeliveries || c.needs.Holds && !has.Holds || c.needs.Backlogs && !has.Backlogs {
			continue
		}
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newSuite(t, open(t)))
		})
	}
}

// Has says what a transport does beyond the delivery every transport
// gives, for the cases that need it.
type Has struct {
	// Order: each subscription of a consumer hands out its messages in
	// the order they were published (not the memory transport, which
	// hands every message to each of a consumer's subscriptions).
	Order bool
	// Partitions: the transport partitions a consumer (driver.Assigner).
	Partitions bool
	// Redeliveries: the transport tells a first delivery from a
	// redelivery (framework.MetadataRedelivered), and a process's stop
	// can hand messages back to the next one (not SQLite, whose
	// attempt holds the file's write lock, so nothing is published
	// while the stop drains it).
	Redeliveries bool
	// Holds: the transport's subscriber keeps an ordered consumer's
	// waiting events out of its window (driver.Holder), and attempts
	// run at the same time (not SQLite, whose attempt holds the file's
	// write lock).
	Holds bool
	// Backlogs: the transport counts what waits for a consumer
	// (driver.BacklogCounter), and the store holds leases
	// (driver.Purger).
	Backlogs bool
}

// ExerciseServerRestart publishes a backlog, restarts the server while a
// Runner drains it (restart must return once the server is back), and
// checks that every event took effect exactly once. It needs no
// Env.PublishRaw.
func ExerciseServerRestart(t *testing.T, env *Env, restart func(t *testing.T)) {
	t.Helper()
	s := newSuite(t, env)
	s.slow = 20 * time.Millisecond
	const n = 200
	// The Runner binds its queue or group at Start, before the backlog.
	p := s.start(t, s.consumer("drain"), 2, s.typ)
	defer p.stop()
	ids := s.publishN(t, s.typ, n, 0)
	s.waitEffects(t, "drain", 10)
	restart(t)
	s.waitEffects(t, "drain", n)
	settle()
	s.requireExactlyOnce(t, "drain", ids)
}

// noteV1 is the suite's payload.
type noteV1 struct {
	Text string `json:"text" validate:"required"`
}

// suite is one case's state.
type suite struct {
	env  *Env
	id   string // unique per case: names its types and consumers
	typ  framework.Definition[noteV1]
	typ2 framework.Definition[noteV1]

	// behave decides what a handler does after writing its effect.
	behave atomic.Pointer[func(consumer string, ev framework.Event[noteV1], call int) error]
	slow   time.Duration
	// outside, when set, is what a handler does before its first
	// statement (a call to another service).
	outside func(ctx context.Context, ev framework.Event[noteV1]) error
	tune    func(cfg *runner.Config) // adjusts the Runner of the processes started after it is set
	// around is middleware around the whole chain of the processes
	// started after it is set (Runner.AddMiddleware): it sees nacks.
	around []message.HandlerMiddleware
	// inOrder, when set, runs in each handler after its effect, in its
	// transaction.
	inOrder func(ctx context.Context, ev framework.Event[noteV1]) error
	// partitions is the partitions of the order cases' consumer.
	partitions int

	mu    sync.Mutex
	calls map[string]int // consumer/source/id → calls
	acked map[string]int // consumer → messages acknowledged
}

func newSuite(t *testing.T, env *Env) *suite {
	t.Helper()
	require.NotNil(t, env.DB, "Env.DB")
	require.NotNil(t, env.Store, "Env.Store")
	require.NotNil(t, env.Transport, "Env.Transport")
	t.Cleanup(func() { _ = env.Transport.Close() })
	if env.Timeout == 0 {
		env.Timeout = 60 * time.Second
	}
	ctx := context.Background()
	require.NoError(t, migrate.Up(ctx, env.DB, migrate.Config{}))
	_, err := env.DB.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS effects (consumer TEXT NOT NULL, source TEXT NOT NULL, event_id TEXT NOT NULL, text TEXT NOT NULL)`)
	require.NoError(t, err)
	id := randomHex(6)
	return &suite{
		env:   env,
		id:    id,
		typ:   framework.Define[noteV1]("runnertest.t"+id+".noted", 1),
		typ2:  framework.Define[noteV1]("runnertest.t"+id+".amended", 1),
		calls: make(map[string]int),
		acked: make(map[string]int),
	}
}

// consumer returns the case's consumer name for role.
func (s *suite) consumer(role string) string { return "rt-" + s.id + "." + role }

// process is one running instance of a consumer: a Runner on a transport
// of its own (Env.Process) or the Env's.
type process struct {
	runner         *runner.Runner
	closeTransport func() error // the process's own transport (Env.Process)
	once           sync.Once
}

// start runs a process of the consumer named name handling defs, with
// concurrency messages in flight, until stop or the end of the test.
func (s *suite) start(t *testing.T, name string, concurrency int, defs ...framework.Definition[noteV1]) *process {
	t.Helper()
	var handlers []framework.Handler
	for _, def := range defs {
		handlers = append(handlers, framework.Handle(def, s.handler(name)))
	}
	c, err := framework.NewConsumer(name, handlers...)
	require.NoError(t, err)
	tr := s.env.Transport
	closeTransport := func() error { return nil }
	if s.env.Process != nil {
		tr = s.env.Process(t)
		closeTransport = tr.Close
	}
	cfg := runner.Config{
		Consumers: []runner.ConsumerConfig{{
			Consumer: c,
			Settings: middleware.Settings{
				Attempts:      3,
				RetryDelay:    time.Millisecond,
				Timeout:       10 * time.Second,
				Concurrency:   concurrency,
				MaxDeliveries: 100,
			},
		}},
		Transport: tr,
		DB:        s.env.DB,
		Store:     s.env.Store,
		Outer:     []message.HandlerMiddleware{s.countAcks(name)},
	}
	if s.tune != nil {
		s.tune(&cfg)
	}
	r, err := runner.New(cfg)
	if err != nil {
		_ = closeTransport()
	}
	require.NoError(t, err)
	r.AddMiddleware(s.around...)
	p := &process{runner: r, closeTransport: closeTransport}
	ctx, cancel := context.WithTimeout(context.Background(), s.env.Timeout)
	defer cancel()
	if err := r.Start(ctx); err != nil {
		_ = closeTransport()
		t.Fatalf("runner of %s: %v", name, err)
	}
	t.Cleanup(p.stop)
	return p
}

// stopGracefully stops the process as a service's stop does: its
// attempts in flight end, it hands its partitions back.
func (p *process) stopGracefully(t *testing.T) {
	t.Helper()
	p.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		require.NoError(t, p.runner.Stop(ctx))
		_ = p.closeTransport()
	})
}

// stop stops the process at once, as if it died: the Runner's attempts in
// flight are canceled, roll back, and their messages are delivered again.
func (p *process) stop() {
	p.once.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		_ = p.runner.Stop(ctx) // reports the canceled attempts
		_ = p.closeTransport()
	})
}

func (s *suite) handler(consumer string) framework.HandlerFunc[noteV1] {
	return func(ctx context.Context, ev framework.Event[noteV1]) error {
		s.mu.Lock()
		k := consumer + "/" + ev.Source + "/" + ev.ID
		s.calls[k]++
		call := s.calls[k]
		s.mu.Unlock()
		if s.outside != nil {
			if err := s.outside(ctx, ev); err != nil {
				return err
			}
		}
		if s.slow > 0 {
			select {
			case <-time.After(s.slow):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		_, err := framework.Conn(ctx, s.env.DB).ExecContext(ctx,
			s.env.DB.Rebind(`INSERT INTO effects (consumer, source, event_id, text) VALUES (?, ?, ?, ?)`),
			consumer, ev.Source, ev.ID, ev.Data.Text)
		if err != nil {
			return fmt.Errorf("insert the effect: %w", err)
		}
		if s.inOrder != nil {
			if err := s.inOrder(ctx, ev); err != nil {
				return err
			}
		}
		if b := s.behave.Load(); b != nil {
			return (*b)(consumer, ev, call)
		}
		return nil
	}
}

// countAcks counts the messages of consumer that pass the chain's Outer
// step acknowledged: processed and duplicates (poison and dead letters are
// stored by the steps outside it).
func (s *suite) countAcks(consumer string) message.HandlerMiddleware {
	return func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			out, err := next(msg)
			if err == nil {
				s.mu.Lock()
				s.acked[consumer]++
				s.mu.Unlock()
			}
			return out, err
		}
	}
}

func (s *suite) ackedOf(consumer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.acked[consumer]
}

func (s *suite) setBehave(f func(consumer string, ev framework.Event[noteV1], call int) error) {
	s.behave.Store(&f)
}

func (s *suite) callsOf(consumer, source, id string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[consumer+"/"+source+"/"+id]
}

// message returns the framework's message of a note event.
func (s *suite) message(t *testing.T, def framework.Definition[noteV1], source, id, text string) *message.Message {
	t.Helper()
	env, err := def.Envelope(noteV1{Text: text}, framework.Attributes{ID: id, Source: source})
	require.NoError(t, err)
	msg, err := framework.NewMessage(env)
	require.NoError(t, err)
	return msg
}

func (s *suite) publish(t *testing.T, def framework.Definition[noteV1], msgs ...*message.Message) {
	t.Helper()
	require.NoError(t, s.env.Transport.Publisher().Publish(def.Type(), msgs...))
}

// publishN publishes n distinct events of def (ids from+0 .. from+n-1)
// and returns their ids.
func (s *suite) publishN(t *testing.T, def framework.Definition[noteV1], n, from int) []string {
	t.Helper()
	ids := make([]string, n)
	msgs := make([]*message.Message, n)
	for i := range n {
		ids[i] = fmt.Sprintf("ev-%d", from+i)
		msgs[i] = s.message(t, def, "notes", ids[i], "hello")
	}
	for start := 0; start < n; start += 50 {
		s.publish(t, def, msgs[start:min(start+50, n)]...)
	}
	return ids
}

func (s *suite) count(t *testing.T, query string, args ...any) int {
	t.Helper()
	var n int
	require.NoError(t, s.env.DB.GetContext(context.Background(), &n, s.env.DB.Rebind(query), args...))
	return n
}

func (s *suite) effects(t *testing.T, consumer string) int {
	return s.count(t, `SELECT count(*) FROM effects WHERE consumer = ?`, consumer)
}

// waitFor polls cond until it holds or the Env's timeout passes.
func (s *suite) waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	s.waitForWithin(t, s.env.Timeout, what, cond)
}

// waitForWithin is waitFor with a timeout of its own.
func (s *suite) waitForWithin(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (s *suite) waitEffects(t *testing.T, role string, n int) {
	t.Helper()
	consumer := s.consumer(role)
	s.waitFor(t, fmt.Sprintf("%d effects of %s", n, consumer), func() bool { return s.effects(t, consumer) >= n })
}

func (s *suite) deadLetters(t *testing.T, consumer string) []driver.DeadLetter {
	t.Helper()
	dls, err := s.env.Store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: consumer})
	require.NoError(t, err)
	return dls
}

// effectCounts returns how many effects each event took for consumer.
func (s *suite) effectCounts(t *testing.T, consumer string) map[string]int {
	t.Helper()
	var got []struct {
		EventID string `db:"event_id"`
		N       int    `db:"n"`
	}
	require.NoError(t, s.env.DB.SelectContext(context.Background(), &got,
		s.env.DB.Rebind(`SELECT event_id, count(*) AS n FROM effects WHERE consumer = ? GROUP BY event_id`), consumer))
	counts := make(map[string]int, len(got))
	for _, g := range got {
		counts[g.EventID] = g.N
	}
	return counts
}

// requireExactlyOnce checks that each of ids took effect once for the
// consumer of role, with one processed mark each, and nothing else did.
func (s *suite) requireExactlyOnce(t *testing.T, role string, ids []string) {
	t.Helper()
	consumer := s.consumer(role)
	counts := s.effectCounts(t, consumer)
	for _, id := range ids {
		require.Equalf(t, 1, counts[id], "effects of event %s", id)
	}
	require.Len(t, counts, len(ids), "no other event took effect")
	require.Equal(t, len(ids), s.count(t, `SELECT count(*) FROM processed_events WHERE consumer = ?`, consumer), "processed marks")
}

// settle waits a little so that a wrong extra delivery would show.
func settle() { time.Sleep(300 * time.Millisecond) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

var errTransient = errors.New("transient failure")
