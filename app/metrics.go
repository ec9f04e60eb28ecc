package app

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework/driver"
)

// resolutions counts the replays and discards of dead letters that this
// process recorded (the console's, and a command's in its own process),
// by consumer. A command run in another process counts there, where
// nothing scrapes it: the gauge effectively_dead_letters_pending is the
// source of truth.
type resolutions struct {
	replays, discards *prometheus.CounterVec
}

// newResolutions returns the counters, registered on reg.
func newResolutions(reg registry) (*resolutions, error) {
	r := &resolutions{
		replays: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_dead_letter_replays_total",
			Help: "Dead letters replayed through this process (the console, or a command run in it), by consumer.",
		}, []string{"consumer"}),
		discards: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "effectively_dead_letter_discards_total",
			Help: "Dead letters discarded through this process (the console, or a command run in it), by consumer.",
		}, []string{"consumer"}),
	}
	for _, c := range []prometheus.Collector{r.replays, r.discards} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: %w", err)
		}
	}
	return r, nil
}

// observe counts a resolution the store committed (the stores'
// OnResolve).
func (r *resolutions) observe(dl driver.DeadLetter, res driver.Resolution) {
	switch res.Status {
	case driver.DeadLetterReplayed:
		r.replays.WithLabelValues(dl.Consumer).Inc()
	case driver.DeadLetterDiscarded:
		r.discards.WithLabelValues(dl.Consumer).Inc()
	}
}
