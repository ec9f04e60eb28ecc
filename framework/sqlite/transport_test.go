package sqlite

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// TestLeaseFor shows that the lease, renewed while a message is held,
// depends on the attempt timeout alone (not on the messages in flight nor
// the attempts): a crashed process's messages wait about one lease
// whatever the concurrency.
func TestLeaseFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, time.Minute, leaseFor(30*time.Second), "the default attempt timeout")
	require.Equal(t, 2*time.Second, leaseFor(time.Second), "a renewal may wait for an attempt that runs to its timeout")
	require.Equal(t, time.Second, leaseFor(time.Millisecond), "never below a second")
	require.Equal(t, time.Duration(math.MaxInt64), leaseFor(2000000*time.Hour), "never overflows")
}

// TestTransportSubscribe shows that a consumer's subscriber holds its
// concurrency in flight, with the lease of its attempt timeout (the
// configured one without), and reads each type and its replay topic.
func TestTransportSubscribe(t *testing.T) {
	t.Parallel()
	tr, err := New(openPubSubTestDB(t), TransportConfig{Subscriber: SubscriberConfig{LeaseDuration: 7 * time.Second}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, tr.Close()) })

	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "c", Types: []string{"a", "b"}, Concurrency: 32, AttemptTimeout: 5 * time.Second})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b", pipeline.ReplayTopic("c")}, sub.Topics)
	require.Equal(t, []string{"a", "b"}, sub.Bind)
	cfg := sub.Subscriber.(*Subscriber).cfg
	require.Equal(t, "c", cfg.ConsumerGroup)
	require.Equal(t, 32, cfg.MaxInFlight)
	require.Equal(t, 32, cfg.ClaimBatchSize, "claims fill the free slots of the concurrency")
	require.Equal(t, 10*time.Second, cfg.LeaseDuration)
	require.NoError(t, sub.Initialize())

	sub, err = tr.Subscribe(driver.SubscribeConfig{Consumer: "d", Types: []string{"a"}})
	require.NoError(t, err)
	require.Equal(t, 7*time.Second, sub.Subscriber.(*Subscriber).cfg.LeaseDuration, "the configured lease")
	require.Equal(t, 1, sub.Subscriber.(*Subscriber).cfg.MaxInFlight, "concurrency defaults to 1")
	require.False(t, sub.Subscriber.(*Subscriber).settles, "each message watched: the reader may not settle it")

	sub, err = tr.Subscribe(driver.SubscribeConfig{Consumer: "e", Types: []string{"a"}, Settles: true})
	require.NoError(t, err)
	require.True(t, sub.Subscriber.(*Subscriber).settles, "the reader settles each message: none watched")

	set, err := New(openPubSubTestDB(t), TransportConfig{Subscriber: SubscriberConfig{ClaimBatchSize: 4}})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, set.Close()) })
	sub, err = set.Subscribe(driver.SubscribeConfig{Consumer: "c", Types: []string{"a"}, Concurrency: 16})
	require.NoError(t, err)
	require.Equal(t, 4, sub.Subscriber.(*Subscriber).cfg.ClaimBatchSize, "the configured claim size")

	_, err = tr.Subscribe(driver.SubscribeConfig{Types: []string{"a"}})
	require.ErrorContains(t, err, "SubscribeConfig.Consumer")
	_, err = New(nil, TransportConfig{})
	require.ErrorIs(t, err, ErrMissingDB)
	_, err = New(openPubSubTestDB(t), TransportConfig{TablePrefix: "Bad-"})
	require.ErrorContains(t, err, "TransportConfig.TablePrefix")
}
