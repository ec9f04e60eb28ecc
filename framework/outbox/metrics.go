package outbox

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the Prometheus metrics of the relays of one registry.
type Metrics struct {
	published prometheus.Counter
	failures  prometheus.Counter
	oldest    prometheus.Gauge

	unroutable *prometheus.GaugeVec   // by type
	dropped    *prometheus.CounterVec // by type
}

// NewMetrics creates the relays' metrics and registers them on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "effectively_outbox_published_total",
			Help: "Outbox rows published by the relays.",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "effectively_outbox_publish_failures_total",
			Help: "Relay polls that stopped at a row they could not publish or mark.",
		}),
		oldest: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "effectively_outbox_oldest_unsent_seconds",
			Help: "Age of the oldest unsent outbox row after the last poll; 0 when none waits. Alert when it grows.",
		}),
		unroutable: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "effectively_outbox_unroutable_rows",
			Help: "Unsent outbox rows of an event type whose exchange has no queue bound, after the last poll: they wait, tried again at each poll, until a queue is bound. Alert when above 0.",
		}, []string{"type"}),
		dropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_outbox_unroutable_dropped_total",
			Help: "Outbox rows of an event type declared droppable (RelayConfig.DropUnroutable) that no queue was bound to: marked sent, never delivered.",
		}, []string{"type"}),
	}
	for _, c := range []prometheus.Collector{m.published, m.failures, m.oldest, m.unroutable, m.dropped} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register outbox metrics: %w", err)
		}
	}
	return m, nil
}

// Published returns the counter of published rows.
func (m *Metrics) Published() prometheus.Counter { return m.published }

// Failures returns the counter of polls that stopped at a failure.
func (m *Metrics) Failures() prometheus.Counter { return m.failures }

// OldestUnsent returns the gauge of the oldest unsent row's age.
func (m *Metrics) OldestUnsent() prometheus.Gauge { return m.oldest }
