package runner

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/effectively-once/effectively/framework/driver"
)

// partitionsTimeout bounds the reads of one scrape of the partitions'
// gauges: the leases, then what waits in each partition, which the
// transport counts (at most driver.BacklogCap index entries per
// partition and topic on PostgreSQL).
const partitionsTimeout = 5 * time.Second

// partitionedConsumer is what the partitions' gauges read of a
// partitioned consumer.
type partitionedConsumer struct {
	name       string
	types      []string
	partitions int
}

// partitionsCollector exports the gauges of the partitioned consumers,
// read on scrape (cached figuresTTL; a read that fails serves the last
// one):
//
//   - effectively_partition_leases{consumer,partition,owner}: 1 for a
//     partition whose lease a live process holds (owner: its member
//     name), 0 with owner "" for one free or expired;
//   - effectively_partition_backlog{consumer,partition}: the messages
//     waiting in the partition (driver.BacklogCounter, at most
//     driver.BacklogCap), when the transport counts them.
//
// A consumer has at most driver.MaxPartitions partitions, and each a
// series of each gauge: a bounded number. Every replica reads the same
// database and broker and exports the same values: alert rules take their
// max() across replicas.
type partitionsCollector struct {
	consumers []partitionedConsumer
	leases    driver.Leases
	counter   driver.BacklogCounter // nil when the transport counts none
	logger    *slog.Logger
	now       func() time.Time

	leasesDesc, backlogDesc *prometheus.Desc

	mu       sync.Mutex
	read     time.Time                            // when the figures were read; zero before
	owners   map[string][]string                  // by consumer: each partition's live owner, "" when none
	backlogs map[string][]driver.PartitionBacklog // by consumer
}

// newPartitionsCollector returns the collector of the partitions of
// consumers, with leases from leases and backlogs from counter (nil when
// the transport counts none).
func newPartitionsCollector(consumers []partitionedConsumer, leases driver.Leases, counter driver.BacklogCounter, logger *slog.Logger) *partitionsCollector {
	return &partitionsCollector{
		consumers: consumers,
		leases:    leases,
		counter:   counter,
		logger:    logger,
		now:       time.Now,
		leasesDesc: prometheus.NewDesc("effectively_partition_leases",
			"1 for a partition of a partitioned consumer whose lease a live process (owner, its member name) holds, 0 with owner \"\" for one free or expired; read from the database, the same in every replica.",
			[]string{"consumer", "partition", "owner"}, nil),
		backlogDesc: prometheus.NewDesc("effectively_partition_backlog",
			"Messages waiting in a partition of a partitioned consumer, counted by the transport up to 100000; the same in every replica.",
			[]string{"consumer", "partition"}, nil),
		owners:   make(map[string][]string),
		backlogs: make(map[string][]driver.PartitionBacklog),
	}
}

// Describe implements prometheus.Collector.
func (c *partitionsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.leasesDesc
	ch <- c.backlogDesc
}

// Collect implements prometheus.Collector: the figures read within
// figuresTTL, else read now.
func (c *partitionsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := c.now(); c.read.IsZero() || now.Sub(c.read) >= figuresTTL {
		ctx, cancel := context.WithTimeout(context.Background(), partitionsTimeout)
		c.refresh(ctx)
		cancel()
		c.read = now
	}
	for _, pc := range c.consumers {
		for p, owner := range c.owners[pc.name] {
			value := 0.0
			if owner != "" {
				value = 1
			}
			ch <- prometheus.MustNewConstMetric(c.leasesDesc, prometheus.GaugeValue, value, pc.name, strconv.Itoa(p), owner)
		}
		for _, b := range c.backlogs[pc.name] {
			ch <- prometheus.MustNewConstMetric(c.backlogDesc, prometheus.GaugeValue, float64(b.Waiting), pc.name, strconv.Itoa(b.Partition))
		}
	}
}

// refresh reads each consumer's leases and backlogs; a read that fails
// keeps the consumer's last figures.
func (c *partitionsCollector) refresh(ctx context.Context) {
	for _, pc := range c.consumers {
		leases, err := c.leases.PartitionLeases(ctx, pc.name)
		if err != nil {
			c.logger.Warn("metrics: read the partitions' leases; serving the last read", "consumer", pc.name, "error", err)
		} else {
			now := c.now()
			owners := make([]string, pc.partitions)
			for _, l := range leases {
				if l.Partition >= 0 && l.Partition < pc.partitions && l.Owner != "" && !l.Expires.Before(now) {
					owners[l.Partition] = l.Owner
				}
			}
			c.owners[pc.name] = owners
		}
		if c.counter == nil {
			continue
		}
		backlogs, err := c.counter.Backlogs(ctx, pc.name, pc.types, pc.partitions)
		if err != nil {
			c.logger.Warn("metrics: count what waits in the partitions; serving the last count", "consumer", pc.name, "error", err)
			continue
		}
		c.backlogs[pc.name] = backlogs
	}
}
