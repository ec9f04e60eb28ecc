package faults_test

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/rs/zerolog"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// holePublisher publishes nothing; its first Publish cuts its relay off
// from the server first (hole), so that the batch's claim is made and its
// transaction open when the partition starts.
type holePublisher struct {
	once sync.Once
	hole func()
}

func (p *holePublisher) Publish(string, ...*message.Message) error {
	p.once.Do(p.hole)
	return nil
}

func (p *holePublisher) Close() error { return nil }

// recordingPublisher records the messages it takes, by id.
type recordingPublisher struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

func (p *recordingPublisher) Publish(_ string, msgs ...*message.Message) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range msgs {
		p.ids[m.UUID] = struct{}{}
	}
	return nil
}

func (p *recordingPublisher) Close() error { return nil }

func (p *recordingPublisher) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ids)
}

// TestPartitionedRelayClaim: an outbox relay on PostgreSQL is cut off
// from the server, its connections kept open (no FIN gets through), right
// after its batch claimed the rows, while it publishes them. The server
// ends the claim's transaction by itself, once it waited idle past the
// batch's end (twice BatchTimeout) and its grace: another relay then
// publishes the rows. Until then they stay locked, and the server's
// transaction horizon held, below which the PostgreSQL transport reads
// (so on a server of its own); without the bound, until TCP gives up.
func TestPartitionedRelayClaim(t *testing.T) {
	t.Parallel()
	const (
		rows         = 10
		batchTimeout = time.Second
		// bound is the claim's idle bound (2 × batchTimeout + 2 s) with
		// room for a loaded machine.
		bound = 30 * time.Second
	)
	ctx := t.Context()
	dbURL := testserver.StartPostgres(t).URL
	db, err := postgres.Open(ctx, dbURL, postgres.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
	box, err := outbox.New(db, outbox.Config{})
	require.NoError(t, err)
	added := framework.Define[placedV1]("faults.order.relayed", 1)
	tx, err := db.BeginTxx(ctx, nil)
	require.NoError(t, err)
	for i := range rows {
		env, err := added.Envelope(placedV1{Order: i + 1}, framework.Attributes{ID: fmt.Sprintf("o-%d", i), Source: "faults"})
		require.NoError(t, err)
		require.NoError(t, box.AddTx(ctx, tx, env))
	}
	require.NoError(t, tx.Commit())

	// The relay cut off, through a proxy, its sessions named.
	u, err := url.Parse(dbURL)
	require.NoError(t, err)
	proxy := startProxy(t, toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop()), "postgres", u.Host)
	const appName = "faults-partitioned-relay"
	u.Host = proxy.Listen
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	cutDB, err := postgres.Open(ctx, u.String(), postgres.OpenConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cutDB.Close() })
	var (
		cutAt time.Time
		holes []toxic
	)
	hole := &holePublisher{hole: func() {
		for _, stream := range []string{"upstream", "downstream"} {
			holes = append(holes, addToxic(t, proxy, "drop", stream, map[string]any{"partition": true}))
		}
		cutAt = time.Now()
	}}
	t.Cleanup(func() { // before the proxy goes: their stubs wait for this
		for _, x := range holes {
			_ = x.proxy.Toxics.RemoveToxic(context.Background(), x.name)
		}
	})
	cut, err := outbox.NewRelay(cutDB, hole, outbox.RelayConfig{BatchTimeout: batchTimeout})
	require.NoError(t, err)
	_, err = cut.PublishUnsent(ctx)
	require.Error(t, err, "the cut-off relay marks nothing")
	require.False(t, cutAt.IsZero(), "the relay claimed and published")

	pub := &recordingPublisher{ids: map[string]struct{}{}}
	other, err := outbox.NewRelay(db, pub, outbox.RelayConfig{})
	require.NoError(t, err)
	deadline := cutAt.Add(bound)
	for pub.count() < rows {
		require.True(t, time.Now().Before(deadline), "the claimed rows still locked %s after the partition: %d of %d published by another relay", bound, pub.count(), rows)
		_, err := other.PublishUnsent(ctx)
		require.NoError(t, err)
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("another relay published the claimed rows %.1f s after the partition (the claim's idle bound: %s)",
		time.Since(cutAt).Seconds(), 2*batchTimeout+2*time.Second)
	var open int
	require.NoError(t, db.GetContext(ctx, &open, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state LIKE 'idle in transaction%'`, appName))
	require.Zero(t, open, "the cut-off relay's transaction ended on the server")
}
