package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

const (
	// lagLease names the lease that the one process of a service which
	// reads the consumers' lag holds (driver.Purger.AcquireLease).
	lagLease = "lag"
	// LagLeaseTTL is how long the lag reader's lease lasts unless a scrape
	// renews it: once its holder stops, or is no longer scraped, another
	// process takes it over at a scrape after this.
	LagLeaseTTL = time.Minute
	// lagTimeout bounds the reads of one scrape of the lag gauges.
	lagTimeout = 5 * time.Second
)

// LagConsumer is a consumer whose lag LagGauges reads.
type LagConsumer struct {
	Name string
	// Types are the event types it receives (driver.BacklogCounter).
	Types []string
	// Partitions is its count of partitions; 1 or less when it is not
	// partitioned.
	Partitions int
}

// LagConfig configures LagGauges.
type LagConfig struct {
	// Consumers are every consumer the service declares, those this
	// process does not run included. Required.
	Consumers []LagConsumer
	// Backlogs counts what waits for each consumer. Required.
	Backlogs driver.BacklogCounter
	// Leases hold the lease that makes one process of the service, at a
	// time, read and export the figures (the purge's store). Required.
	Leases driver.Purger
	// Holder names this process as the lease's holder, unique among the
	// processes of the service. Defaults to NewMember().
	Holder string
	// TTL is how long a read is served from a cache: scrapes closer
	// together read once. Defaults to 5 seconds.
	TTL time.Duration
	// Logger receives the warnings of the reads that fail. Defaults to
	// none.
	Logger *slog.Logger
}

// LagGauges is a prometheus.Collector of the consumers' lag, by consumer
// and partition (the partition "0" when the consumer is not partitioned),
// read from the database or the broker on scrape by the one process of
// the service that holds the lease "lag" (LagLeaseTTL), for every
// consumer declared: they are reported while the processes that run a
// consumer are down, and the same figures are not exported by every
// replica:
//
//   - effectively_consumer_lag_messages: the messages waiting
//     (driver.PartitionBacklog.Waiting, at most driver.BacklogCap);
//   - effectively_consumer_lag_seconds: the age of the oldest message not
//     yet handled (driver.PartitionBacklog.Oldest). On a transport that
//     cannot tell it (driver.InFlightAger: RabbitMQ), the age of the
//     oldest message handed to the consumer in this process and not yet
//     finished, since it was published (framework.MetadataPublishedAt),
//     else since it was handed; every process that runs the
//     consumer exports its own, the lease's holder or not, and 0 when it
//     holds none.
//
// A read that fails serves the last one. A Runner with a Registerer
// registers one for its consumers; build one with NewLagGauges to read
// the figures from a process that runs none.
type LagGauges struct {
	cfg      LagConfig
	inFlight *flights // nil unless the transport ages nothing waiting
	now      func() time.Time

	messagesDesc, secondsDesc *prometheus.Desc

	mu      sync.Mutex
	read    time.Time // when the figures were read; zero before
	holds   bool      // this process held the lease at the last read
	figures map[string][]driver.PartitionBacklog
}

// NewLagGauges returns the collector of cfg's consumers' lag.
func NewLagGauges(cfg LagConfig) (*LagGauges, error) {
	if cfg.Backlogs == nil || cfg.Leases == nil {
		return nil, errors.New("runner: lag gauges: LagConfig.Backlogs and LagConfig.Leases are required")
	}
	if cfg.Holder == "" {
		cfg.Holder = NewMember()
	}
	if cfg.TTL <= 0 {
		cfg.TTL = figuresTTL
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	g := &LagGauges{
		cfg: cfg,
		now: time.Now,
		messagesDesc: prometheus.NewDesc("effectively_consumer_lag_messages",
			"Messages waiting for a consumer, by partition (0 when not partitioned), counted by the transport up to 100000; exported by one process of the service (the lease \"lag\"), for every declared consumer.",
			[]string{"consumer", "partition"}, nil),
		secondsDesc: prometheus.NewDesc("effectively_consumer_lag_seconds",
			"Age of a consumer's oldest message not yet handled, by partition: on sqlite and postgres the oldest waiting, by the database's clock, from one process of the service; on amqp the oldest handed to the consumer in this process and not yet finished, since it was published (else since it was handed).",
			[]string{"consumer", "partition"}, nil),
		figures: make(map[string][]driver.PartitionBacklog),
	}
	if a, ok := cfg.Backlogs.(driver.InFlightAger); ok && a.AgesInFlight() {
		g.inFlight = newFlights()
	}
	return g, nil
}

// Describe implements prometheus.Collector.
func (g *LagGauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- g.messagesDesc
	ch <- g.secondsDesc
}

// Collect implements prometheus.Collector: the figures read within the
// TTL, else read now when this process holds the lease or takes it.
func (g *LagGauges) Collect(ch chan<- prometheus.Metric) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if now := g.now(); g.read.IsZero() || now.Sub(g.read) >= g.cfg.TTL {
		ctx, cancel := context.WithTimeout(context.Background(), lagTimeout)
		g.refresh(ctx)
		cancel()
		g.read = now
	}
	for _, c := range g.cfg.Consumers {
		n := max(c.Partitions, 1)
		for p := range n {
			label := strconv.Itoa(p)
			var b driver.PartitionBacklog
			if figures := g.figures[c.Name]; g.holds && p < len(figures) {
				b = figures[p]
				ch <- prometheus.MustNewConstMetric(g.messagesDesc, prometheus.GaugeValue, float64(b.Waiting), c.Name, label)
			}
			switch {
			case g.inFlight != nil:
				age := g.inFlight.oldest(c.Name, p, g.now())
				ch <- prometheus.MustNewConstMetric(g.secondsDesc, prometheus.GaugeValue, age.Seconds(), c.Name, label)
			case g.holds && b.OldestKnown:
				ch <- prometheus.MustNewConstMetric(g.secondsDesc, prometheus.GaugeValue, b.Oldest.Seconds(), c.Name, label)
			}
		}
	}
}

// refresh takes or renews the lease and, held, reads each consumer's
// backlogs; a read that fails keeps the consumer's last figures.
func (g *LagGauges) refresh(ctx context.Context) {
	holds, err := g.cfg.Leases.AcquireLease(ctx, lagLease, g.cfg.Holder, LagLeaseTTL)
	if err != nil {
		g.cfg.Logger.Warn("metrics: take the lag reader's lease; serving the last read", "error", err)
		return
	}
	g.holds = holds
	if !holds {
		clear(g.figures)
		return
	}
	for _, c := range g.cfg.Consumers {
		backlogs, err := g.cfg.Backlogs.Backlogs(ctx, c.Name, c.Types, c.Partitions)
		if err != nil {
			g.cfg.Logger.Warn("metrics: read a consumer's lag; serving the last read", "consumer", c.Name, "error", err)
			continue
		}
		g.figures[c.Name] = backlogs
	}
}

// Release gives up the lease, if this process holds it, so that another
// process reads the figures at its next scrape.
func (g *LagGauges) Release(ctx context.Context) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.holds, g.read = false, time.Time{}
	if err := g.cfg.Leases.ReleaseLease(ctx, lagLease, g.cfg.Holder); err != nil {
		return fmt.Errorf("runner: lag gauges: release the lease: %w", err)
	}
	return nil
}

// flights are the messages handed to the consumers of this process and
// not yet finished, with when each was published (as its transport
// tells: framework.MetadataPublishedAt), else when it was handed: the age
// of a consumer's oldest message where the transport cannot tell it
// (driver.InFlightAger).
type flights struct {
	mu        sync.Mutex
	consumers map[string]string // router handler name → consumer; set before Start
	since     map[*message.Message]handed
}

// handed is a message handed to a consumer, in flight.
type handed struct {
	consumer  string
	partition int
	since     time.Time
}

func newFlights() *flights {
	return &flights{consumers: make(map[string]string), since: make(map[*message.Message]handed)}
}

// enter records msg, handed to its router handler's consumer now, as in
// flight since it was published, when its transport tells and that was
// before now, else since now.
func (f *flights) enter(msg *message.Message) {
	p, _ := driver.PartitionFromContext(msg.Context())
	since := time.Now()
	// Only some transports tell (RabbitMQ's deliveries do not): an empty
	// value costs no parse, which fails and allocates its error.
	if v := msg.Metadata.Get(framework.MetadataPublishedAt); v != "" {
		if at, err := time.Parse(time.RFC3339Nano, v); err == nil && at.Before(since) {
			since = at
		}
	}
	fl := handed{consumer: f.consumers[message.HandlerNameFromCtx(msg.Context())], partition: p, since: since}
	f.mu.Lock()
	f.since[msg] = fl
	f.mu.Unlock()
}

// leave forgets msg, finished.
func (f *flights) leave(msg *message.Message) {
	f.mu.Lock()
	delete(f.since, msg)
	f.mu.Unlock()
}

// oldest returns the age at now of consumer's oldest message in flight in
// partition; 0 when none.
func (f *flights) oldest(consumer string, partition int, now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var age time.Duration
	for _, fl := range f.since {
		if fl.consumer == consumer && fl.partition == partition {
			age = max(age, now.Sub(fl.since))
		}
	}
	return age
}

// addLagGauges registers the lag gauges of every consumer of the runner
// (see LagGauges) on cfg.Registerer, when the transport counts backlogs
// and the Store holds leases (driver.Purger).
func (r *Runner) addLagGauges() error {
	leases, ok := r.cfg.Store.(driver.Purger)
	if !ok || r.cfg.Registerer == nil || r.cfg.Backlogs == nil {
		return nil
	}
	consumers := make([]LagConsumer, 0, len(r.cfg.Consumers))
	for _, cc := range r.cfg.Consumers {
		consumers = append(consumers, LagConsumer{Name: cc.Consumer.Name(), Types: cc.Consumer.Types(), Partitions: cc.Partitions})
	}
	g, err := NewLagGauges(LagConfig{Consumers: consumers, Backlogs: r.cfg.Backlogs, Leases: leases, Holder: r.member, Logger: r.logger})
	if err != nil {
		return err
	}
	for name, consumer := range r.lagNames {
		if g.inFlight != nil {
			g.inFlight.consumers[name] = consumer
		}
	}
	if err := r.cfg.Registerer.Register(g); err != nil {
		if r.gauges != nil {
			r.cfg.Registerer.Unregister(r.gauges)
		}
		if r.partGauges != nil {
			r.cfg.Registerer.Unregister(r.partGauges)
		}
		return fmt.Errorf("Config.Registerer: the lag gauges: %w", err)
	}
	r.lag = g
	return nil
}

// lagHandler records that the router handler name is consumer's, for the
// ages of the messages in flight.
func (r *Runner) lagHandler(name, consumer string) {
	if r.lagNames == nil {
		r.lagNames = make(map[string]string)
	}
	r.lagNames[name] = consumer
}

// flights returns the messages in flight that the lag gauges age; nil
// when they age none.
func (r *Runner) flights() *flights {
	if r.lag == nil {
		return nil
	}
	return r.lag.inFlight
}

// removeLagGauges unregisters the lag gauges and gives up their lease.
func (r *Runner) removeLagGauges(ctx context.Context) {
	if r.lag == nil {
		return
	}
	r.cfg.Registerer.Unregister(r.lag)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	if err := r.lag.Release(ctx); err != nil {
		r.logger.Warn("metrics: give up the lag reader's lease; it ends by itself", "error", err, "within", LagLeaseTTL)
	}
}
