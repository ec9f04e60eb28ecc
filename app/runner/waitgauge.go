package runner

import (
	"fmt"
	"sort"

	"github.com/prometheus/client_golang/prometheus"
)

// waitingCollector exports effectively_consumer_waiting_messages
// {consumer}: the events of each ordered consumer (strict_order,
// skip_stale) that wait in this process for an earlier event of their
// subject to go first (see sequencer). The transport handed them out and
// they are not acknowledged. Unlike the database gauges the figure is the
// process's own: alert rules sum it across replicas. A line that never
// empties shows here (and in the queue's unacknowledged messages), not in
// the database.
type waitingCollector struct {
	desc       *prometheus.Desc
	consumers  []string // sorted
	sequencers map[string]*sequencer
}

// newWaitingCollector returns the collector of the sequencers, by
// consumer.
func newWaitingCollector(sequencers map[string]*sequencer) *waitingCollector {
	consumers := make([]string, 0, len(sequencers))
	for c := range sequencers {
		consumers = append(consumers, c)
	}
	sort.Strings(consumers)
	return &waitingCollector{
		desc: prometheus.NewDesc("effectively_consumer_waiting_messages",
			"Events of an ordered consumer (strict_order, skip_stale) waiting in this process for an earlier event of their subject, unacknowledged; this process's own figure.",
			[]string{"consumer"}, nil),
		consumers:  consumers,
		sequencers: sequencers,
	}
}

// Describe implements prometheus.Collector.
func (c *waitingCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

// Collect implements prometheus.Collector.
func (c *waitingCollector) Collect(ch chan<- prometheus.Metric) {
	for _, consumer := range c.consumers {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(c.sequencers[consumer].waitingEvents()), consumer)
	}
}

// addWaitingGauge registers the gauge of the events waiting in the
// ordered consumers' sequencers (see waitingCollector), if any, on
// cfg.Registerer.
func (r *Runner) addWaitingGauge() error {
	if len(r.ordered) == 0 || r.cfg.Registerer == nil {
		return nil
	}
	wc := newWaitingCollector(r.ordered)
	if err := r.cfg.Registerer.Register(wc); err != nil {
		r.unregisterGauges()
		return fmt.Errorf("Config.Registerer: the ordered consumers' gauge: %w", err)
	}
	r.waiting = wc
	return nil
}

// unregisterGauges unregisters from cfg.Registerer the gauges the runner
// registered there, the lag's apart (see removeLagGauges).
func (r *Runner) unregisterGauges() {
	if r.gauges != nil {
		r.cfg.Registerer.Unregister(r.gauges)
	}
	if r.partGauges != nil {
		r.cfg.Registerer.Unregister(r.partGauges)
	}
	if r.waiting != nil {
		r.cfg.Registerer.Unregister(r.waiting)
	}
}
