package faults_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/Shopify/toxiproxy/v2/toxics"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// transports are the two set-ups every fault runs on: RabbitMQ with
// PostgreSQL for the stores, and the PostgreSQL transport (the stores'
// database), each with two instances sharing the partitioned consumer:
// the first in the test's process, the second in a process of its own.
var transports = []struct {
	name string
	cfg  rigConfig
}{
	{"AMQP", rigConfig{Transport: app.TransportAMQP, Instances: 2, Rate: 10}},
	{"Postgres", rigConfig{Transport: app.TransportPostgres, Instances: 2, Rate: 10}},
}

// breaksBroker runs the test again without the race detector, and
// reports so, when its faults break the service's RabbitMQ connection
// (a reset, a black hole past the heartbeat) under -race: watermill-amqp
// writes its connection's state unguarded when it reconnects, a race of
// the library's own that fails every test running at that moment (the
// framework's tests of a broker restart do the same).
func breaksBroker(t *testing.T) bool {
	t.Helper()
	if !testserver.RaceEnabled {
		return false
	}
	testserver.RerunWithoutRace(t, t.Name())
	return true
}

// onEachTransport runs f on each of transports, in parallel subtests
// named after them.
func onEachTransport(t *testing.T, f func(t *testing.T, name string, cfg rigConfig)) {
	t.Helper()
	for _, tc := range transports {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f(t, tc.name, tc.cfg)
		})
	}
}

// onBothStreams adds a toxic of typ with attrs to both streams of the
// rig's proxies that pick returns, and returns what removes them.
func onBothStreams(t *testing.T, typ string, attrs map[string]any, pick func(r *rig) []*toxiproxy.Proxy) func(r *rig) func() {
	return func(r *rig) func() {
		var xs []toxic
		for _, p := range pick(r) {
			for _, s := range []string{"upstream", "downstream"} {
				xs = append(xs, addToxic(t, p, typ, s, attrs))
			}
		}
		return func() {
			for _, x := range xs {
				x.remove(t)
			}
		}
	}
}

// onEveryProxy adds a toxic of typ with attrs to both streams of every
// proxy of the rig, and returns what removes them.
func onEveryProxy(t *testing.T, typ string, attrs map[string]any) func(r *rig) func() {
	return onBothStreams(t, typ, attrs, (*rig).proxies)
}

// blackHole makes the proxy that pick returns forward nothing, both ways
// (Toxiproxy's timeout toxic with no timeout), and returns what mends it.
func blackHole(t *testing.T, pick func(r *rig) *toxiproxy.Proxy) func(r *rig) func() {
	return onBothStreams(t, "timeout", map[string]any{"timeout": 0}, func(r *rig) []*toxiproxy.Proxy {
		return []*toxiproxy.Proxy{pick(r)}
	})
}

// TestLatency: 200 ms more on every round trip (100 ms each way, ±25 ms
// of jitter each way) on every connection for 10 s: consumption slows,
// nothing fails for good.
func TestLatency(t *testing.T) {
	t.Parallel()
	onEachTransport(t, func(t *testing.T, name string, cfg rigConfig) {
		newRig(t, cfg).run(fault{
			Name: name + " latency 200±50 ms", For: 10 * time.Second,
			Apply: onEveryProxy(t, "latency", map[string]any{"latency": 100, "jitter": 25}),
		})
	})
}

// TestBandwidth: every connection limited to 4 kB/s each way for 10 s.
func TestBandwidth(t *testing.T) {
	t.Parallel()
	onEachTransport(t, func(t *testing.T, name string, cfg rigConfig) {
		newRig(t, cfg).run(fault{
			Name: name + " bandwidth 4 kB/s", For: 10 * time.Second,
			Apply: onEveryProxy(t, "bandwidth", map[string]any{"rate": 4}),
		})
	})
}

// TestResetPeerMidStream: for 10 s, every 2 s, each connection that
// carries data within 200 ms is reset (TCP RST), both ways, on every
// proxy: the consumers', the relays' and the purge's connections break
// mid-stream, over and over.
func TestResetPeerMidStream(t *testing.T) {
	t.Parallel()
	onEachTransport(t, func(t *testing.T, name string, cfg rigConfig) {
		if cfg.Transport == app.TransportAMQP && breaksBroker(t) {
			return
		}
		r := newRig(t, cfg)
		r.run(fault{Name: name + " reset_peer mid-stream", For: 10 * time.Second, Apply: func(r *rig) func() {
			stop, done := make(chan struct{}), make(chan struct{})
			go func() {
				defer close(done)
				tick := time.NewTicker(2 * time.Second)
				defer tick.Stop()
				for {
					end := onEveryProxy(t, "reset_peer", map[string]any{"timeout": 0})(r)
					time.Sleep(200 * time.Millisecond)
					end()
					select {
					case <-stop:
						return
					case <-tick.C:
					}
				}
			}()
			return func() { close(stop); <-done }
		}})
	})
}

// TestResetPeerMidCommit: a crash hook at the commit of a consumer's
// transaction, and at the outbox relay's record of what it sent, in the
// instance that runs in the test's process, arms a reset of PostgreSQL's
// connections on the way back (every instance's): the COMMIT reaches
// the server, which commits, and its answer never reaches the service,
// whose connection breaks. Armed every 500 ms for 10 s; the effect
// committed is not applied again, the event not lost.
func TestResetPeerMidCommit(t *testing.T) {
	t.Parallel()
	onEachTransport(t, func(t *testing.T, name string, cfg rigConfig) {
		r := newRig(t, cfg)
		var resets atomic.Int64
		r.run(fault{Name: name + " reset_peer mid-commit", For: 10 * time.Second, Apply: func(r *rig) func() {
			var (
				mu    sync.Mutex
				armed bool
				wg    sync.WaitGroup
			)
			arm := make(chan struct{}, 1)
			stop := make(chan struct{})
			wg.Go(func() {
				tick := time.NewTicker(500 * time.Millisecond)
				defer tick.Stop()
				for {
					select {
					case <-stop:
						return
					case <-tick.C:
						select {
						case arm <- struct{}{}:
						default:
						}
					}
				}
			})
			h := crash.Hook(func(_ context.Context, at crash.Point) bool {
				if at != crash.BeforeCommit && at != crash.BeforeOutboxSent {
					return false
				}
				select {
				case <-arm:
				default:
					return false
				}
				mu.Lock()
				defer mu.Unlock()
				if armed {
					return false
				}
				armed = true
				x := addToxic(t, r.pg, "reset_peer", "downstream", map[string]any{"timeout": 0})
				resets.Add(1)
				wg.Go(func() {
					time.Sleep(100 * time.Millisecond)
					mu.Lock()
					defer mu.Unlock()
					x.remove(t)
					armed = false
				})
				return false // the delivery goes on: the network fails it
			})
			r.hook.Store(&h)
			return func() {
				r.hook.Store(nil)
				close(stop)
				wg.Wait()
			}
		}})
		t.Logf("%s: %d resets armed at a commit", name, resets.Load())
	})
}

// TestBlackHolePostgres: PostgreSQL's connections forward nothing, and
// new ones are taken and forward nothing either (Toxiproxy's timeout
// toxic with no timeout), both ways: on RabbitMQ for 60 s, on the
// PostgreSQL transport, three instances, for 15 s. Consumption pauses,
// the attempts in flight are not charged, and it resumes by itself. Each
// runs on a PostgreSQL server of its own: the transactions the hole holds
// open would hold back the other tests' PostgreSQL transports (see
// rigConfig.OwnServer), which stalled them past their bound.
func TestBlackHolePostgres(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  rigConfig
		hole time.Duration
	}{
		{"AMQP", rigConfig{Transport: app.TransportAMQP, Instances: 2, Rate: 10, OwnServer: true}, 60 * time.Second},
		{"Postgres", rigConfig{Transport: app.TransportPostgres, Instances: 3, Rate: 10, OwnServer: true}, 15 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRig(t, tc.cfg)
			r.run(fault{
				Name: tc.name + " PostgreSQL black hole", For: tc.hole, Pauses: true,
				Apply: blackHole(t, func(r *rig) *toxiproxy.Proxy { return r.pg }),
			})
		})
	}
}

// TestBlackHoleRabbitMQ: RabbitMQ's connections forward nothing, both
// ways, for 15 s; PostgreSQL answers. The consumers and the outbox relay
// pause, and resume by themselves.
func TestBlackHoleRabbitMQ(t *testing.T) {
	t.Parallel()
	if breaksBroker(t) {
		return
	}
	r := newRig(t, rigConfig{Transport: app.TransportAMQP, Instances: 2, Rate: 10})
	r.run(fault{
		Name: "RabbitMQ black hole", For: 15 * time.Second, Pauses: true,
		Apply: blackHole(t, func(r *rig) *toxiproxy.Proxy { return r.mq }),
	})
}

// TestLostPostgres: PostgreSQL's connections lose what they carry, both
// ways, for 300 ms, and then forward again, open (the toxic "drop"): a
// request or an answer lost in that moment leaves its connection waiting,
// after the fault's end, for an answer that never comes, as behind a
// proxy that dropped it. Nothing but a statement's own bound ends such a
// wait: consumption resumes within 15 s, on each transport (on RabbitMQ
// with the stores, the outbox relay and the partitions on PostgreSQL).
// It resumes in 6.5 to 10 s: a subscription's statement, the making of
// its connection, the outbox relay's statements and the PostgreSQL
// transport's publisher's inserts each get 3 s at first (see
// internal/bound).
func TestLostPostgres(t *testing.T) {
	t.Parallel()
	onEachTransport(t, func(t *testing.T, name string, cfg rigConfig) {
		newRig(t, cfg).run(fault{
			Name: name + " PostgreSQL loses 300 ms", For: 300 * time.Millisecond, Resume: 15 * time.Second,
			Apply: onBothStreams(t, "drop", nil, func(r *rig) []*toxiproxy.Proxy { return []*toxiproxy.Proxy{r.pg} }),
		})
	})
}

// dropToxic drops what it is given, and leaves the connection open, also
// once removed: what it dropped is lost. With Partition it never closes
// its side, not even when the other side closes, as a network partition
// lets no FIN through: the server keeps a session cut off this way open,
// and its transaction with it, until something on the server ends it.
type dropToxic struct {
	Partition bool `json:"partition"`
}

// Pipe drops every chunk until interrupted or the input ends; at the
// input's end, with Partition, it waits to be interrupted, holding its
// output open.
func (d *dropToxic) Pipe(stub *toxics.ToxicStub) {
	for {
		select {
		case <-stub.Interrupt:
			return
		case c := <-stub.Input:
			if c == nil && d.Partition {
				<-stub.Interrupt
				return
			}
			if c == nil {
				stub.Close()
				return
			}
		}
	}
}

// init registers dropToxic as "drop" in Toxiproxy's registry of toxic
// types, which is the library's own and global: the in-process servers of
// the rigs look it up there.
func init() { toxics.Register("drop", new(dropToxic)) }
