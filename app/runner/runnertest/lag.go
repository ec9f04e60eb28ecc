package runnertest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// caseLag: the lag gauges, read by a process that runs no consumer (it
// holds the lease "lag"), move while the consumer's process is down: 0
// messages waiting once it bound its queue or group and stopped, then
// the events published meanwhile, and on a transport that ages them
// (SQL) a growing age of the oldest; 0 again once a process of the
// consumer handled them. On a transport that ages only the messages in
// flight (RabbitMQ), the consumer's process exports the age of the one
// it holds.
func caseLag(t *testing.T, s *suite) {
	name := s.consumer("lag")
	counter, ok := s.env.Transport.(driver.BacklogCounter)
	require.True(t, ok, "the transport counts backlogs")
	leases, ok := s.env.Store.(driver.Purger)
	require.True(t, ok, "the store holds leases")
	observer, err := runner.NewLagGauges(runner.LagConfig{
		Consumers: []runner.LagConsumer{{Name: name, Types: []string{s.typ.Type()}}},
		Backlogs:  counter, Leases: leases, TTL: time.Nanosecond,
	})
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(observer))
	_, inFlight := counter.(driver.InFlightAger)

	s.start(t, name, 1, s.typ).stopGracefully(t) // binds its queue or group
	waiting, age := lagOf(t, reg, name)
	require.Equal(t, 0.0, waiting)
	require.Equal(t, 0.0, age)

	ids := s.publishN(t, s.typ, 3, 0)
	s.waitFor(t, "3 messages waiting", func() bool { waiting, _ = lagOf(t, reg, name); return waiting == 3 })
	if !inFlight {
		s.waitFor(t, "the oldest's age", func() bool { _, age = lagOf(t, reg, name); return age >= 0.05 })
	}

	release := make(chan struct{})
	s.setBehave(func(string, framework.Event[noteV1], int) error { <-release; return nil })
	own := prometheus.NewRegistry()
	s.tune = func(cfg *runner.Config) { cfg.Registerer = own }
	s.start(t, name, 1, s.typ)
	if inFlight {
		s.waitFor(t, "the age of the message in flight", func() bool { _, age := lagOf(t, own, name); return age >= 0.05 })
	}
	close(release)
	s.waitEffects(t, "lag", 3)
	s.waitFor(t, "nothing waiting", func() bool {
		waiting, age = lagOf(t, reg, name)
		if inFlight {
			_, age = lagOf(t, own, name)
		}
		return waiting == 0 && age == 0
	})
	s.requireExactlyOnce(t, "lag", ids)
}

// lagOf returns consumer's lag gauges in a scrape of reg, partition 0:
// -1 for one absent.
func lagOf(t *testing.T, reg *prometheus.Registry, consumer string) (waiting, age float64) {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	waiting, age = -1, -1
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] != consumer || labels["partition"] != "0" {
				continue
			}
			switch mf.GetName() {
			case "effectively_consumer_lag_messages":
				waiting = m.GetGauge().GetValue()
			case "effectively_consumer_lag_seconds":
				age = m.GetGauge().GetValue()
			}
		}
	}
	return waiting, age
}
