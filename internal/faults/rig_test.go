package faults_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// resumeBound is how soon after a fault ends the service must consume
// again (issue 46).
const resumeBound = 10 * time.Second

// waitLimit bounds the waits that end only on a hang.
const waitLimit = 90 * time.Second

// rigConfig says what a rig runs.
type rigConfig struct {
	// Transport is app.TransportAMQP (RabbitMQ, with PostgreSQL for the
	// stores) or app.TransportPostgres.
	Transport string
	// Instances is how many instances of the service share the
	// partitioned consumer, each with pools and connections of its own.
	Instances int
	// Rate is how many events the load publishes a second.
	Rate int
	// OwnServer runs the rig on a PostgreSQL server of its own rather
	// than on the shared one: a fault that holds the service's
	// transactions open (a black hole) holds back every PostgreSQL
	// transport's delivery on its server, other tests' too, until they
	// end (messages are read below the oldest running transaction).
	OwnServer bool
}

// rig is one test's service: its instances, their proxies, the load.
type rig struct {
	t   *testing.T
	cfg rigConfig

	service
	toxi         *toxiproxy.ApiServer
	pg, mq       *toxiproxy.Proxy // mq nil on the PostgreSQL transport
	admin        *sqlx.DB         // straight to PostgreSQL, on the test's schema
	spec         childSpec        // what every instance runs (see service.config)
	instances    []*instance
	members      []string
	hook         atomic.Pointer[crash.Hook] // armed by the mid-commit tests
	publisher    message.Publisher
	closePub     func() error
	published    atomic.Int64
	loadStop     chan struct{}
	loadDone     chan struct{}
	publishFails atomic.Int64
	logs         rigLog
}

// instance is one process of the service: the first runs in the test's
// process (an fx application, whose crash points the tests hook), the
// others each in a process of its own (see startChild).
type instance struct {
	fx      *fx.App
	store   driver.Store
	child   *child
	stopped bool
}

// newRig starts cfg.Instances instances of the service behind fresh
// proxies, on a schema of the test's own, and the load's publisher,
// which reaches the servers directly: the faults are the consumers',
// the relays' and the purge's, not the producer's. All stop when the
// test ends.
func newRig(t *testing.T, cfg rigConfig) *rig {
	t.Helper()
	id := randomHex(5)
	r := &rig{
		t:       t,
		cfg:     cfg,
		service: newService(id),
		toxi:    toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()),
	}
	r.logs.printOnFailure(t)
	var dbURL string
	if cfg.OwnServer {
		dbURL = testserver.StartPostgres(t).URL
	} else {
		dbURL = testenv.PostgresURL(t)
	}
	admin, err := postgres.Open(t.Context(), dbURL, postgres.OpenConfig{MaxOpenConns: 4})
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	r.admin = admin

	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	r.pg = r.proxy("postgres", u.Host)
	u.Host = r.pg.Listen

	var mqURL string
	if cfg.Transport == app.TransportAMQP {
		mqURL = testenv.Require(t, testenv.AMQPURLVar)
		mu, err := url.Parse(mqURL)
		require.NoError(t, err)
		r.mq = r.proxy("rabbitmq", mu.Host)
		mu.Host = r.mq.Listen
		r.spec.AMQPURL = mu.String()
	}
	r.spec.ID, r.spec.Transport, r.spec.DatabaseURL = id, cfg.Transport, u.String()
	switch cfg.Transport {
	case app.TransportAMQP:
		tr, err := amqp.New(amqp.TransportConfig{URL: mqURL})
		require.NoError(t, err)
		require.NoError(t, tr.Connect(t.Context()))
		r.publisher, r.closePub = tr.Publisher(), tr.Close
	case app.TransportPostgres:
		tr, err := postgres.New(t.Context(), admin, postgres.TransportConfig{})
		require.NoError(t, err)
		r.publisher, r.closePub = tr.Publisher(), tr.Close
	default:
		t.Fatalf("transport %q: want amqp or postgres", cfg.Transport)
	}
	t.Cleanup(func() { _ = r.closePub() })

	r.instances = append(r.instances, r.start())
	for i := 1; i < cfg.Instances; i++ {
		r.instances = append(r.instances, r.startChild(i))
	}
	t.Cleanup(r.stopAll) // before the proxies close (cleanups run last first)
	r.members = r.awaitMembers()
	return r
}

// proxy starts a Toxiproxy proxy of the rig's server (see startProxy).
func (r *rig) proxy(name, upstream string) *toxiproxy.Proxy {
	r.t.Helper()
	return startProxy(r.t, r.toxi, name, upstream)
}

// startProxy starts a Toxiproxy proxy of toxi named name on a free
// loopback port to upstream, removed, its connections closed, when the
// test ends.
func startProxy(t *testing.T, toxi *toxiproxy.ApiServer, name, upstream string) *toxiproxy.Proxy {
	t.Helper()
	p := toxiproxy.NewProxy(toxi, name, "127.0.0.1:0", upstream)
	require.NoError(t, toxi.Collection.Add(p, true))
	t.Cleanup(func() { _ = toxi.Collection.Remove(name) })
	return p
}

// start starts the first instance of the service, in the test's
// process, its crash points hooked to r.hook.
func (r *rig) start() *instance {
	r.t.Helper()
	cfg, err := r.config(r.spec)
	require.NoError(r.t, err)
	in := &instance{}
	hook := crash.Hook(func(ctx context.Context, at crash.Point) bool {
		if h := r.hook.Load(); h != nil {
			return (*h)(ctx, at)
		}
		return false
	})
	in.fx = app.New(r.module(cfg, r.logs.logger(0), hook), fx.Populate(&in.store))
	require.NoError(r.t, in.fx.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(r.t, in.fx.Start(ctx))
	return in
}

// stopAll stops every instance still running.
func (r *rig) stopAll() {
	r.stopLoad()
	for _, in := range r.instances {
		r.stop(in)
	}
}

func (r *rig) stop(in *instance) {
	if in.stopped {
		return
	}
	in.stopped = true
	if in.child != nil {
		require.NoError(r.t, in.child.stop(waitLimit))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	require.NoError(r.t, in.fx.Stop(ctx))
}

// awaitMembers returns the members of the partitioned consumer's group,
// once every instance joined it: the application_name of each
// instance's connections to PostgreSQL.
func (r *rig) awaitMembers() []string {
	r.t.Helper()
	leases, ok := r.instances[0].store.(driver.Leases)
	require.True(r.t, ok, "the PostgreSQL store keeps leases")
	var members []string
	require.Eventually(r.t, func() bool {
		var err error
		members, err = leases.Members(context.Background(), r.place)
		return err == nil && len(members) == len(r.instances)
	}, waitLimit, 50*time.Millisecond, "every instance a member of %s: %v", r.place, members)
	return members
}

// startLoad publishes cfg.Rate events a second, each with a new id and
// one of 16 subjects, until stopLoad; a publication that fails is tried
// again.
func (r *rig) startLoad() {
	r.loadStop, r.loadDone = make(chan struct{}), make(chan struct{})
	rate := max(r.cfg.Rate, 1)
	go func() {
		defer close(r.loadDone)
		tick := time.NewTicker(time.Second / time.Duration(rate))
		defer tick.Stop()
		for n := 1; ; {
			select {
			case <-r.loadStop:
				return
			case <-tick.C:
			}
			env, err := r.placed.Envelope(placedV1{Order: n}, framework.Attributes{
				ID: fmt.Sprintf("o-%d", n), Source: "faults", Subject: fmt.Sprintf("order-%d", n%16),
			})
			if err != nil {
				panic(err)
			}
			msg, err := framework.NewMessage(env)
			if err != nil {
				panic(err)
			}
			if err := r.publisher.Publish(r.placed.Type(), msg); err != nil {
				r.publishFails.Add(1)
				continue
			}
			r.published.Store(int64(n))
			n++
		}
	}()
}

// stopLoad stops the load, if it runs, and waits for its last
// publication.
func (r *rig) stopLoad() {
	if r.loadStop == nil {
		return
	}
	select {
	case <-r.loadStop:
	default:
		close(r.loadStop)
	}
	<-r.loadDone
}

// effects returns how many effects, and of how many events, consumer
// recorded.
func (r *rig) effects(consumer string) (rows, events int) {
	r.t.Helper()
	var got struct {
		Rows   int `db:"rows"`
		Events int `db:"events"`
	}
	require.NoError(r.t, r.admin.Get(&got, `SELECT count(*) AS rows, count(DISTINCT event_id) AS events FROM effects WHERE consumer = $1`, consumer))
	return got.Rows, got.Events
}

// firstEffectAfter returns when consumer first recorded an effect after
// t0, and false if it did not.
func (r *rig) firstEffectAfter(consumer string, t0 time.Time) (time.Time, bool) {
	r.t.Helper()
	var at *time.Time
	require.NoError(r.t, r.admin.Get(&at, `SELECT min(at) FROM effects WHERE consumer = $1 AND at > $2`, consumer, t0))
	if at == nil {
		return time.Time{}, false
	}
	return *at, true
}

// lastEffectBetween returns when consumer last recorded an effect
// between t0 and t1, and false if it did not.
func (r *rig) lastEffectBetween(consumer string, t0, t1 time.Time) (time.Time, bool) {
	r.t.Helper()
	var at *time.Time
	require.NoError(r.t, r.admin.Get(&at, `SELECT max(at) FROM effects WHERE consumer = $1 AND at > $2 AND at <= $3`, consumer, t0, t1))
	if at == nil {
		return time.Time{}, false
	}
	return *at, true
}

// effectsBetween counts consumer's effects between t0 and t1.
func (r *rig) effectsBetween(consumer string, t0, t1 time.Time) int {
	r.t.Helper()
	var n int
	require.NoError(r.t, r.admin.Get(&n, `SELECT count(*) FROM effects WHERE consumer = $1 AND at > $2 AND at <= $3`, consumer, t0, t1))
	return n
}

// sampleDeliveries samples the highest delivery count every 100 ms (the
// purge deletes the counts of events processed, every second here) until
// the function it returns is called, which returns it, or the test
// ends.
func (r *rig) sampleDeliveries() func() int {
	stop, done := make(chan struct{}), make(chan struct{})
	var highest int
	go func() {
		defer close(done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			var n *int
			if err := r.admin.Get(&n, `SELECT max(count) FROM deliveries`); err == nil && n != nil {
				highest = max(highest, *n)
			}
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	var once sync.Once
	end := func() int {
		once.Do(func() { close(stop) })
		<-done
		return highest
	}
	r.t.Cleanup(func() { end() }) // when a check failed first
	return end
}

// connections counts the service's sessions on PostgreSQL: those named
// after its members.
func (r *rig) connections() int {
	r.t.Helper()
	var n int
	require.NoError(r.t, r.admin.Get(&n, `SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY($1)`, r.members))
	return n
}

// pgSession is a session of pg_stat_activity, as diagnose logs it.
type pgSession struct {
	PID     int    `db:"pid"`
	App     string `db:"application_name"`
	State   string `db:"state"`
	Wait    string `db:"wait"`
	Blocked string `db:"blocked"`
	Xact    string `db:"xact"`
	Idle    string `db:"since"`
	Query   string `db:"query"`
}

func (s pgSession) String() string {
	return fmt.Sprintf("%d %s %s wait=%s blocked_by=%s xact=%s since=%s: %s", s.PID, s.App, s.State, s.Wait, s.Blocked, s.Xact, s.Idle, s.Query)
}

// sessions returns the sessions of pg_stat_activity that where (SQL, on
// its columns, with args) selects, in the order of order.
func (r *rig) sessions(where, order string, args ...any) ([]pgSession, error) {
	var out []pgSession
	err := r.admin.Select(&out, `SELECT pid, coalesce(application_name, '') AS application_name, coalesce(state, '') AS state,
		coalesce(wait_event_type || ':' || wait_event, '') AS wait, pg_blocking_pids(pid)::text AS blocked,
		coalesce((now() - xact_start)::text, '') AS xact, coalesce((now() - state_change)::text, '') AS since,
		left(regexp_replace(query, '\s+', ' ', 'g'), 160) AS query
		FROM pg_stat_activity WHERE `+where+` ORDER BY `+order, args...)
	return out, err
}

// diagnose logs, a line each, under why, what a stalled consumer may wait
// for: the service's sessions on PostgreSQL (the idle ones counted, and
// listed when they hold advisory locks), the database's other sessions
// that wait or are in a transaction, the partitioned consumer's members
// and leases as the database sees them now, and the service's last
// warnings.
func (r *rig) diagnose(why string) {
	r.t.Helper()
	r.t.Logf("diagnosis: %s", why)
	sessions, err := r.sessions(`application_name = ANY($1)`, `application_name, xact_start NULLS LAST`, r.members)
	if err != nil {
		r.t.Logf("diagnosis: sessions: %v", err)
	}
	idle := 0
	for _, s := range sessions {
		if s.State == "idle" {
			idle++
			continue
		}
		r.t.Logf("diagnosis: session %s", s)
	}
	r.t.Logf("diagnosis: %d sessions, %d of them idle", len(sessions), idle)
	// The idle ones that hold advisory locks (a subscription's group
	// locks): one whose client lost it, still open on the server, keeps
	// its groups from the client's next connection, which waits quietly.
	var holders []string
	if err := r.admin.Select(&holders, `SELECT a.pid || ' ' || a.application_name || ' idle ' || (now() - a.state_change)::text ||
		' from port ' || coalesce(a.client_port::text, '?') || ', ' || count(*) || ' advisory locks, last: ' || left(a.query, 60)
		FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND a.state = 'idle' AND a.application_name = ANY($1)
		GROUP BY a.pid, a.application_name, a.state_change, a.client_port, a.query ORDER BY a.state_change`, r.members); err != nil {
		r.t.Logf("diagnosis: advisory locks: %v", err)
	}
	for _, h := range holders {
		r.t.Logf("diagnosis: idle session %s", h)
	}
	// The database's other sessions that wait or hold a transaction open:
	// a lock of another test's service (an advisory lock is the whole
	// database's, whatever the schema) can hold this one's.
	others, err := r.sessions(`datname = current_database() AND pid <> pg_backend_pid()
		AND NOT (application_name = ANY($1)) AND (state <> 'idle' OR wait_event_type = 'Lock')
		AND backend_type = 'client backend'`, `xact_start NULLS LAST LIMIT 20`, r.members)
	if err != nil {
		r.t.Logf("diagnosis: other sessions: %v", err)
	}
	for _, o := range others {
		r.t.Logf("diagnosis: other session %s", o)
	}
	var members []string
	if err := r.admin.Select(&members, `SELECT member || ' expires in ' || (expires_at - now())::text FROM consumer_members WHERE consumer = $1`, r.place); err != nil {
		r.t.Logf("diagnosis: members: %v", err)
	}
	var leases []string
	if err := r.admin.Select(&leases, `SELECT partition || ': ' || owner || ' token ' || token || ' expires in ' || (expires_at - now())::text FROM partition_leases WHERE consumer = $1 ORDER BY partition`, r.place); err != nil {
		r.t.Logf("diagnosis: leases: %v", err)
	}
	r.t.Logf("diagnosis: members %q; leases %q", members, leases)
	for _, line := range r.logs.warnings(40) {
		r.t.Logf("diagnosis: log %s", line)
	}
}

// deadLetters returns the dead letters, as text for the failure message.
func (r *rig) deadLetters() []string {
	r.t.Helper()
	var rows []struct {
		Consumer string `db:"consumer"`
		EventID  string `db:"event_id"`
		Code     string `db:"code"`
	}
	require.NoError(r.t, r.admin.Select(&rows, `SELECT consumer, event_id, code FROM dead_letters`))
	out := make([]string, len(rows))
	for i, dl := range rows {
		out[i] = dl.Consumer + " " + dl.EventID + " " + dl.Code
	}
	return out
}

// toxic is one Toxiproxy toxic on a proxy.
type toxic struct {
	proxy *toxiproxy.Proxy
	name  string
}

// addToxic adds a toxic of typ to p on stream ("upstream", toward the
// server, or "downstream") with attrs, and returns it. It may run on any
// goroutine: a failure is reported with Errorf.
func addToxic(t *testing.T, p *toxiproxy.Proxy, typ, stream string, attrs map[string]any) toxic {
	t.Helper()
	name := typ + "_" + stream
	body, err := json.Marshal(map[string]any{"name": name, "type": typ, "stream": stream, "toxicity": 1.0, "attributes": attrs})
	if err == nil {
		_, err = p.Toxics.AddToxicJson(strings.NewReader(string(body)))
	}
	if err != nil {
		t.Errorf("add the toxic %s to %s: %v", name, p.Name, err)
	}
	return toxic{proxy: p, name: name}
}

// remove removes the toxic.
func (x toxic) remove(t *testing.T) {
	t.Helper()
	require.NoError(t, x.proxy.Toxics.RemoveToxic(context.Background(), x.name))
}

// proxies returns the rig's proxies: PostgreSQL's, and RabbitMQ's when
// it runs on it.
func (r *rig) proxies() []*toxiproxy.Proxy {
	if r.mq == nil {
		return []*toxiproxy.Proxy{r.pg}
	}
	return []*toxiproxy.Proxy{r.pg, r.mq}
}

// fault is what a test does to the network, between the load's steady
// state and its end.
type fault struct {
	// Name names it in the log.
	Name string
	// Apply injects the fault and returns what ends it.
	Apply func(r *rig) (end func())
	// For is how long the fault lasts.
	For time.Duration
	// Pauses says the fault stops consumption (a black hole): the test
	// measures how soon effects stopped.
	Pauses bool
	// Resume is how soon after the fault's end the service must consume
	// again. Defaults to resumeBound.
	Resume time.Duration
}

// measures are what a fault test measured.
type measures struct {
	Published      int
	PausedAfter    time.Duration // time from the fault's start to the last effect during it (Pauses)
	DuringFault    int           // effects recorded while the fault lasted
	ResumedAfter   time.Duration // time from the fault's end to the first effect after it, the slower consumer's
	DrainedAfter   time.Duration // time from the fault's end to every event's effect
	ConnsBefore    int           // the service's sessions on PostgreSQL before the fault
	ConnsAfter     int           // and once every event took effect
	ConnsStopped   int           // and once the service stopped
	PublishRetries int64
	// MaxDeliveries is the highest delivery count (the delivery guard's,
	// table deliveries) seen from the fault's start to the end: a count
	// above 1 is a redelivery charged to an event.
	MaxDeliveries int
}

// run runs f under the load and checks every effect once, no dead
// letter, consumption again within f.Resume of the fault's end, and
// the service's connections back to what they were; it logs and
// returns what it measured.
func (r *rig) run(f fault) measures {
	r.t.Helper()
	var m measures
	bound := cmp.Or(f.Resume, resumeBound)
	r.startLoad()
	require.Eventually(r.t, func() bool {
		a, _ := r.effects(r.place)
		b, _ := r.effects(r.ship)
		return a >= 20 && b >= 20
	}, waitLimit, 50*time.Millisecond, "steady load through both consumers")
	m.ConnsBefore = r.connections()

	sampled := r.sampleDeliveries()
	start := time.Now()
	end := f.Apply(r)
	time.Sleep(f.For)
	end()
	ended := time.Now()
	r.t.Logf("%s: from %s to %s", f.Name, start.Format(time.RFC3339Nano), ended.Format(time.RFC3339Nano))

	m.DuringFault = r.effectsBetween(r.place, start, ended) + r.effectsBetween(r.ship, start, ended)
	if f.Pauses {
		last := start
		for _, c := range []string{r.place, r.ship} {
			if at, ok := r.lastEffectBetween(c, start, ended); ok && at.After(last) {
				last = at
			}
		}
		m.PausedAfter = last.Sub(start)
	}

	// Consuming again: a new effect of each consumer after the end. A
	// consumer still idle at the bound has the service's state logged
	// then, while it is stuck.
	deadline := ended.Add(waitLimit)
	diagnosed := false
	for _, c := range []string{r.place, r.ship} {
		for {
			at, ok := r.firstEffectAfter(c, ended)
			if ok {
				m.ResumedAfter = max(m.ResumedAfter, at.Sub(ended))
				r.t.Logf("%s: %s consuming again %s after the fault's end (%s)", f.Name, c, at.Sub(ended), at.Format(time.RFC3339Nano))
				break
			}
			if !diagnosed && time.Since(ended) > bound {
				diagnosed = true
				r.diagnose(fmt.Sprintf("%s: %s idle %s after the fault's end", f.Name, c, bound))
			}
			require.True(r.t, time.Now().Before(deadline), "%s: %s consumed nothing within %s of the fault's end", f.Name, c, waitLimit)
			time.Sleep(20 * time.Millisecond)
		}
	}
	time.Sleep(2 * time.Second) // load after the fault
	r.stopLoad()
	m.Published = int(r.published.Load())
	m.PublishRetries = r.publishFails.Load()

	for _, c := range []string{r.place, r.ship} {
		for {
			rows, events := r.effects(c)
			if events == m.Published {
				require.Equal(r.t, m.Published, rows, "%s: %s: every event's effect once", f.Name, c)
				break
			}
			require.Empty(r.t, r.deadLetters(), "%s: no valid event dead-lettered", f.Name)
			require.True(r.t, time.Now().Before(deadline), "%s: %s has %d of %d events' effects %s after the fault", f.Name, c, events, m.Published, waitLimit)
			time.Sleep(50 * time.Millisecond)
		}
	}
	m.DrainedAfter = time.Since(ended)
	m.MaxDeliveries = sampled()
	require.Empty(r.t, r.deadLetters(), "%s: no valid event dead-lettered", f.Name)
	// Nothing more comes: a late duplicate would show here.
	time.Sleep(time.Second)
	for _, c := range []string{r.place, r.ship} {
		rows, events := r.effects(c)
		require.Equal(r.t, m.Published, events, "%s: %s", f.Name, c)
		require.Equal(r.t, m.Published, rows, "%s: %s: every event's effect once", f.Name, c)
	}

	// The connections: none stuck in a transaction the fault broke (the
	// pools keep what they opened while idle, up to their bounds), and
	// none left once the service stops.
	var stuck int
	require.NoError(r.t, r.admin.Get(&stuck, `SELECT count(*) FROM pg_stat_activity WHERE application_name = ANY($1) AND xact_start < now() - interval '10 seconds'`, r.members))
	m.ConnsAfter = r.connections()
	r.t.Logf("%s: %+v", f.Name, m)
	if stuck > 0 {
		r.diagnose(fmt.Sprintf("%s: %d sessions in a transaction begun over 10 s ago", f.Name, stuck))
	}
	require.Zero(r.t, stuck, "%s: sessions of the service in a transaction begun over 10 s ago", f.Name)
	require.LessOrEqual(r.t, m.ResumedAfter, bound, "%s: consuming again within %s of the fault's end", f.Name, bound)

	r.stopAll()
	require.Eventually(r.t, func() bool {
		m.ConnsStopped = r.connections()
		return m.ConnsStopped == 0
	}, 30*time.Second, 100*time.Millisecond, "%s: no session of the service left on PostgreSQL once it stopped", f.Name)
	r.t.Logf("%s: stopped, %d sessions left", f.Name, m.ConnsStopped)
	return m
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
