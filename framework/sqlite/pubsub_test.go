package sqlite

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/ThreeDotsLabs/watermill/pubsub/tests"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"
)

// pubsubFullEnv, when "1", runs watermill's universal suite in full mode
// (make test-sqlite-pubsub); otherwise it runs in short mode.
const pubsubFullEnv = "EFFECTIVELY_PUBSUB_FULL"

func openPubSubTestDB(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := Open(context.Background(), filepath.Join(t.TempDir(), "pubsub.db"),
		OpenConfig{BusyTimeout: time.Minute, MaxOpenConns: 16})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, db.Close()) })
	return db
}

// universalPubSub returns the constructors the universal suite needs: a
// fresh Publisher and Subscriber on db per call.
func universalPubSub(db *sqlx.DB, n *Notifier) (tests.PubSubConstructor, tests.ConsumerGroupPubSubConstructor) {
	withGroup := func(t *testing.T, group string) (message.Publisher, message.Subscriber) {
		pub, err := NewPublisher(db, PublisherConfig{Notifier: n})
		require.NoError(t, err)
		sub, err := NewSubscriber(db, SubscriberConfig{
			ConsumerGroup: group,
			Notifier:      n,
			PollInterval:  10 * time.Millisecond,
			NackDelay:     5 * time.Millisecond,
			RetryInterval: 10 * time.Millisecond,
			LeaseDuration: time.Minute,
		})
		require.NoError(t, err)
		t.Cleanup(func() {
			_ = pub.Close()
			_ = sub.Close()
		})
		return pub, sub
	}
	return func(t *testing.T) (message.Publisher, message.Subscriber) {
		return withGroup(t, "")
	}, withGroup
}

func universalFeatures() tests.Features {
	return tests.Features{
		ConsumerGroups: true,
		Persistent:     true,
		// Several messages are in flight per subscription and a nacked
		// message comes back later: no order, not even with one subscriber.
		GuaranteedOrder:                     false,
		GuaranteedOrderWithSingleSubscriber: false,
		// A sender cannot tell a lost message from a lost ack.
		ExactlyOnceDelivery: false,
		// A new subscriber of the same group continues where the group
		// is; only a new group reads the messages still kept.
		NewSubscriberReceivesOldMessages: false,
		ForceShort:                       os.Getenv(pubsubFullEnv) != "1",
	}
}

func TestPubSubUniversal(t *testing.T) {
	db := openPubSubTestDB(t)
	ctor, groupCtor := universalPubSub(db, NewNotifier())
	tests.TestPubSub(t, universalFeatures(), ctor, groupCtor)
}

// TestPubSubUniversalPolling runs the suite without a Notifier: every
// message is found by polling, as one published by another process.
func TestPubSubUniversalPolling(t *testing.T) {
	db := openPubSubTestDB(t)
	ctor, groupCtor := universalPubSub(db, nil)
	tests.TestPubSub(t, universalFeatures(), ctor, groupCtor)
}
