package runner

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/memory"
)

// partitionSeries returns the series of the partitions' gauges in a
// scrape of reg, by name, each as its labels and value.
func partitionSeries(t *testing.T, reg *prometheus.Registry) map[string][]map[string]any {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	out := map[string][]map[string]any{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			s := map[string]any{"value": m.GetGauge().GetValue()}
			for _, l := range m.GetLabel() {
				s[l.GetName()] = l.GetValue()
			}
			out[mf.GetName()] = append(out[mf.GetName()], s)
		}
	}
	return out
}

// TestPartitionGauges: a scrape has a lease series per partition of the
// consumer's count, 1 with its owner for a live lease, 0 without one for
// a free partition, none for a partition beyond the count; no backlog
// series when the transport counts none; the figures are read again once
// figuresTTL passed, not before.
func TestPartitionGauges(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	const consumer = "shop.mail"
	for _, l := range []struct {
		partition int
		member    string
	}{{0, "a"}, {2, "b"}, {3, "c"}, {5, "d"}} {
		_, ok, err := store.Acquire(ctx, consumer, l.partition, l.member, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
	}
	require.NoError(t, store.Release(ctx, consumer, 3, "c"))

	pc := newPartitionsCollector([]partitionedConsumer{{name: consumer, types: []string{"shop.order.placed"}, partitions: 4}}, store, nil, slog.New(slog.DiscardHandler))
	clock := time.Now()
	pc.now = func() time.Time { return clock }
	reg := prometheus.NewRegistry()
	require.NoError(t, reg.Register(pc))
	lease := func(p, owner string, v float64) map[string]any {
		return map[string]any{"consumer": consumer, "partition": p, "owner": owner, "value": v}
	}
	series := partitionSeries(t, reg)
	require.ElementsMatch(t, []map[string]any{lease("0", "a", 1), lease("1", "", 0), lease("2", "b", 1), lease("3", "", 0)}, series["effectively_partition_leases"])
	require.NotContains(t, series, "effectively_partition_backlog", "the transport counts none")

	require.NoError(t, store.Release(ctx, consumer, 0, "a"))
	require.ElementsMatch(t, []map[string]any{lease("0", "a", 1), lease("1", "", 0), lease("2", "b", 1), lease("3", "", 0)},
		partitionSeries(t, reg)["effectively_partition_leases"], "served from the cache")
	clock = clock.Add(figuresTTL)
	require.ElementsMatch(t, []map[string]any{lease("0", "", 0), lease("1", "", 0), lease("2", "b", 1), lease("3", "", 0)},
		partitionSeries(t, reg)["effectively_partition_leases"], "read again")
}
