package sqlite

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// BenchmarkPubSub measures publish and consume throughput on one file, in
// messages per second (msgs/s) of publish plus consume, with allocations.
// docs/transports.md records the numbers.
func BenchmarkPubSub(b *testing.B) {
	b.Run("PublishBatch100", func(b *testing.B) {
		benchPubSub(b, 100, 16, nil)
	})
	b.Run("PublishOneByOne", func(b *testing.B) {
		benchPubSub(b, 1, 16, nil)
	})
	for _, inFlight := range []int{1, 16, 64} {
		b.Run(fmt.Sprintf("Consume/MaxInFlight=%d", inFlight), func(b *testing.B) {
			benchPubSub(b, 100, inFlight, nil)
		})
	}
	// Each message is handled the framework's way: a unit of work that
	// marks it processed, writes an effect and acks inside its own write
	// transaction. Attempts serialise on the file's write lock.
	for _, inFlight := range []int{1, 16} {
		b.Run(fmt.Sprintf("HandlerTx/MaxInFlight=%d", inFlight), func(b *testing.B) {
			benchPubSub(b, 100, inFlight, handleInTx)
		})
	}
}

// handleInTx returns a handler that processes each message in a unit of
// work on db, writing one effect row, with the ack in the transaction.
func handleInTx(b *testing.B, db *sqlx.DB) func(*message.Message) {
	_, err := db.Exec(`CREATE TABLE test_marks (consumer TEXT, source TEXT, id TEXT, PRIMARY KEY (consumer, source, id));
		CREATE TABLE test_effects (id TEXT PRIMARY KEY, parent TEXT)`)
	require.NoError(b, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: pubsubTestMarks{}})
	require.NoError(b, err)
	return func(msg *message.Message) {
		_, err := uow.Do(msg.Context(), "bench", framework.Key{Source: "s", ID: msg.UUID}, func(ctx context.Context) error {
			_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO test_effects (id) VALUES (?)`, msg.UUID)
			return err
		})
		if err != nil {
			msg.Nack()
			return
		}
		msg.Ack()
	}
}

func benchPubSub(b *testing.B, publishBatch, maxInFlight int, handler func(*testing.B, *sqlx.DB) func(*message.Message)) {
	db := openPubSubTestDB(b)
	n := NewNotifier()
	pub, err := NewPublisher(db, PublisherConfig{Notifier: n})
	require.NoError(b, err)
	defer pub.Close()
	sub, err := NewSubscriber(db, SubscriberConfig{
		Notifier:       n,
		PollInterval:   10 * time.Millisecond,
		MaxInFlight:    maxInFlight,
		ClaimBatchSize: max(16, maxInFlight),
	})
	require.NoError(b, err)
	defer sub.Close()
	require.NoError(b, sub.SubscribeInitialize("bench"))
	handle := func(msg *message.Message) { msg.Ack() }
	if handler != nil {
		handle = handler(b, db)
	}
	ch, err := sub.Subscribe(context.Background(), "bench")
	require.NoError(b, err)

	payload := []byte(`{"specversion":"1.0","id":"x","source":"bench","type":"bench.done","data":{}}`)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	published := make(chan error, 1)
	go func() {
		for sent := 0; sent < b.N; {
			k := min(publishBatch, b.N-sent)
			msgs := make([]*message.Message, k)
			for i := range msgs {
				msgs[i] = message.NewMessage(watermill.NewUUID(), payload)
			}
			if err := pub.Publish("bench", msgs...); err != nil {
				published <- err
				return
			}
			sent += k
		}
		published <- nil
	}()
	var wg sync.WaitGroup
	for range b.N {
		select {
		case msg := <-ch:
			wg.Add(1)
			go func() { // as watermill's router does
				defer wg.Done()
				handle(msg)
			}()
		case <-time.After(time.Minute):
			b.Fatal("no message within a minute")
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	require.NoError(b, <-published)
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "msgs/s")
}
