package middleware_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/workers"
	"github.com/effectively-once/effectively/middleware"
)

// BenchmarkChain measures the whole consumer chain on a real database:
// decode, delivery guard, retry, timeout, recover, the transaction with
// the processed mark and a handler that inserts one row. It reports
// messages per second; -benchmem adds allocations per message.
func BenchmarkChain(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			b.Run("Unique", func(b *testing.B) { benchmarkChain(b, be, false, true) })
			b.Run("Duplicate", func(b *testing.B) { benchmarkChain(b, be, true, true) })
			// The transport cannot tell a first delivery (watermill-sql):
			// the delivery guard counts each one in a transaction of its
			// own, and the unit of work forgets the count.
			b.Run("UniqueCounted", func(b *testing.B) { benchmarkChain(b, be, false, false) })
		})
	}
}

func benchmarkChain(b *testing.B, be backend, duplicates, knownFirst bool) {
	db, s := be.open(b, nil)
	ctx := context.Background()
	require.NoError(b, migrate.Up(ctx, db, migrate.Config{}))
	_, err := db.Exec(`CREATE TABLE effects (source TEXT NOT NULL, event_id TEXT NOT NULL, text TEXT NOT NULL)`)
	require.NoError(b, err)
	insert := db.Rebind(`INSERT INTO effects (source, event_id, text) VALUES (?, ?, ?)`)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(ctx context.Context, ev framework.Event[noteV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, ev.Source, ev.ID, ev.Data.Text)
		return err
	}))
	require.NoError(b, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: s})
	require.NoError(b, err)
	h, _, err := middleware.Handler(middleware.Config{
		Consumer: c, UnitOfWork: uow, Store: s,
		Settings: middleware.Settings{
			Attempts:   3,
			RetryDelay: time.Millisecond,
		},
	})
	require.NoError(b, err)

	bodies := make([][]byte, b.N)
	for i := range bodies {
		id := fmt.Sprint(i)
		if duplicates {
			id = "same"
		}
		env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{ID: id, Source: "bench"})
		require.NoError(b, err)
		bodies[i], err = framework.Encode(env)
		require.NoError(b, err)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		msg := message.NewMessage(fmt.Sprint(i), bodies[i])
		if knownFirst { // a transport that tells first deliveries spares the count
			msg.Metadata.Set(framework.MetadataRedelivered, "false")
		}
		if err := h(msg); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkChainInMemory measures the chain's own cost per message, without
// a database (see memoryChain).
func BenchmarkChainInMemory(b *testing.B) {
	h, msgs := memoryChain(b, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		if err := h(msgs[i]); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}

// BenchmarkChainInMemoryRouted is BenchmarkChainInMemory with each message
// handled on a goroutine of its own, as watermill's router does: what the
// chain's depth costs in stack growth shows here.
func BenchmarkChainInMemoryRouted(b *testing.B) { benchmarkChainRouted(b, false) }

// BenchmarkChainInMemoryPooled is BenchmarkChainInMemoryRouted with each
// message's goroutine handing the chain to a worker that outlives it, as
// the runner does (internal/workers): the stack grows once per worker
// instead of once per message.
func BenchmarkChainInMemoryPooled(b *testing.B) { benchmarkChainRouted(b, true) }

func benchmarkChainRouted(b *testing.B, pooled bool) {
	h, msgs := memoryChain(b, b.N)
	var pool workers.Pool
	defer pool.Close()
	chain := func(msg *message.Message) ([]*message.Message, error) { return nil, h(msg) }
	handle := func(msg *message.Message) error {
		if !pooled {
			return h(msg)
		}
		_, err := pool.Handle(chain, msg)
		return err
	}
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	done := make(chan error)
	for i := range b.N {
		go func() { done <- handle(msgs[i]) }()
		if err := <-done; err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
}
