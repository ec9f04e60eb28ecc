package postgres_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// BenchmarkTransportConsume measures how fast one consumer group drains a
// backlog of CloudEvent-sized messages, acking each at once, for several
// batch sizes (docs/transports.md quotes the results):
//
//	go test -run '^$' -bench TransportConsume -benchtime 2000x ./framework/postgres/
func BenchmarkTransportConsume(b *testing.B) {
	for _, batch := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("Batch%d", batch), func(b *testing.B) {
			url := testenv.PostgresURL(b)
			db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 4})
			require.NoError(b, err)
			defer db.Close()
			cfg := postgres.TransportConfig{URL: url, BatchSize: batch, PollInterval: 10 * time.Millisecond}
			tr, err := postgres.New(context.Background(), db, cfg)
			require.NoError(b, err)
			defer tr.Close()
			pub := tr.Publisher()
			s, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "bench", Types: []string{"bench.noted"}})
			require.NoError(b, err)
			sub := s.Subscriber
			body := []byte(`{"specversion":"1.0","id":"x","source":"bench","type":"bench.noted","eventversion":1,"data":{"text":"hello, this is a payload of a typical size"}}`)
			msgs := make([]*message.Message, 0, 100)
			for i := 0; i < b.N; i++ {
				msgs = append(msgs, message.NewMessage(fmt.Sprint(i), body))
				if len(msgs) == cap(msgs) || i == b.N-1 {
					require.NoError(b, pub.Publish("bench", msgs...))
					msgs = msgs[:0]
				}
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			b.ResetTimer()
			ch, err := sub.Subscribe(ctx, "bench")
			require.NoError(b, err)
			for range b.N {
				(<-ch).Ack()
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
		})
	}
}
