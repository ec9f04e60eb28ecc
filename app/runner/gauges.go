package runner

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework/driver"
)

const (
	// figuresTTL is how long the gauges read from the database are
	// served from a cache: scrapes closer together query once.
	figuresTTL = 5 * time.Second
	// figuresTimeout bounds the queries of one scrape; a scrape whose
	// queries fail or time out serves the figures read before, if any.
	figuresTimeout = 2 * time.Second
)

// figuresCollector exports the gauges read from the database on scrape:
// effectively_dead_letters_pending{consumer,code} and
// effectively_parked_events{consumer}. Every process of a service reads
// the same database, so every replica exports the same values: alert
// rules take their max() across replicas.
type figuresCollector struct {
	gauges driver.Gauges
	logger *slog.Logger
	now    func() time.Time

	pending, parked *prometheus.Desc

	mu      sync.Mutex
	read    time.Time // when figures were read; zero before the first read
	figures driver.Figures
}

// newFiguresCollector returns the collector of gauges.
func newFiguresCollector(gauges driver.Gauges, logger *slog.Logger) *figuresCollector {
	return &figuresCollector{
		gauges: gauges,
		logger: logger,
		now:    time.Now,
		pending: prometheus.NewDesc("effectively_dead_letters_pending",
			"Dead letters waiting for an operator (replay or discard), by consumer and code; read from the database, the same in every replica.",
			[]string{"consumer", "code"}, nil),
		parked: prometheus.NewDesc("effectively_parked_events",
			"Events parked behind a dead letter of their subject, or waiting for an earlier event (strict_order), by consumer; read from the database, the same in every replica.",
			[]string{"consumer"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *figuresCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.parked
}

// Collect implements prometheus.Collector: the figures read within
// figuresTTL, else read now.
func (c *figuresCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.read.IsZero() || now.Sub(c.read) >= figuresTTL {
		ctx, cancel := context.WithTimeout(context.Background(), figuresTimeout)
		f, err := c.gauges.Figures(ctx)
		cancel()
		if err != nil {
			c.logger.Warn("metrics: read the dead letters' and parked events' figures; serving the last read", "error", err)
		} else {
			c.figures, c.read = f, now
		}
	}
	for _, p := range c.figures.PendingDeadLetters {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(p.Count), p.Consumer, string(p.Code))
	}
	for _, p := range c.figures.Parked {
		ch <- prometheus.MustNewConstMetric(c.parked, prometheus.GaugeValue, float64(p.Count), p.Consumer)
	}
}
