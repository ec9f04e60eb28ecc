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

// BenchmarkPartitionedConsume measures how fast processes of a consumer
// of 4 partitions drain a backlog of CloudEvent-sized messages on 64
// subjects, acking each at once: one process owning every partition,
// then two owning half each (on one machine: they share its cores and
// its PostgreSQL):
//
//	go test -run '^$' -bench PartitionedConsume -benchtime 4000x ./framework/postgres/
func BenchmarkPartitionedConsume(b *testing.B) {
	for _, procs := range []int{1, 2} {
		b.Run(fmt.Sprintf("Processes%d", procs), func(b *testing.B) {
			const n = 4
			url := testenv.PostgresURL(b)
			db, err := postgres.Open(context.Background(), url, postgres.OpenConfig{MaxOpenConns: 4})
			require.NoError(b, err)
			defer db.Close()
			cfg := postgres.TransportConfig{URL: url, PollInterval: 10 * time.Millisecond}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var chans []<-chan *message.Message
			var pub message.Publisher
			for i := range procs {
				tr, err := postgres.New(context.Background(), db, cfg)
				require.NoError(b, err)
				defer tr.Close()
				pub = tr.Publisher()
				s, err := tr.Subscribe(driver.SubscribeConfig{Consumer: "bench", Types: []string{"bench.noted"}, Partitions: n, Concurrency: 64})
				require.NoError(b, err)
				require.NoError(b, s.Initialize())
				var parts []int
				for p := i; p < n; p += procs {
					parts = append(parts, p)
				}
				require.NoError(b, s.Subscriber.(driver.Assigner).Assign(ctx, parts))
				defer s.Subscriber.Close()
				ch, err := s.Subscriber.Subscribe(ctx, "bench.noted")
				require.NoError(b, err)
				chans = append(chans, ch)
			}
			msgs := make([]*message.Message, 0, 100)
			for i := 0; i < b.N; i++ {
				body := fmt.Appendf(nil, `{"specversion":"1.0","id":"x-%d","source":"bench","type":"bench.noted","subject":"s-%d","eventversion":1,"data":{"text":"hello, this is a payload of a typical size"}}`, i, i%64)
				msgs = append(msgs, message.NewMessage(fmt.Sprint(i), body))
				if len(msgs) == cap(msgs) || i == b.N-1 {
					require.NoError(b, pub.Publish("bench.noted", msgs...))
					msgs = msgs[:0]
				}
			}
			b.ResetTimer()
			done := make(chan struct{}, 2*b.N) // room for redeliveries: no sender blocks
			for _, ch := range chans {
				go func() {
					for msg := range ch {
						msg.Ack()
						done <- struct{}{}
					}
				}()
			}
			for range b.N {
				<-done
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
			cancel()
		})
	}
}
