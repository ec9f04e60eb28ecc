package middleware_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// BenchmarkHandWritten is the baseline BenchmarkChain is measured
// against: the consumer a careful engineer writes by hand on watermill,
// with the same guarantees as far as it goes. It decodes the JSON body,
// and in one transaction checks a processed table, writes the effect and
// the mark; watermill's Retry and Recoverer around it; no metrics, no
// tracing, no delivery count, no dead letters.
func BenchmarkHandWritten(b *testing.B) {
	for _, be := range backends {
		b.Run(be.name, func(b *testing.B) {
			db, _ := be.open(b, nil)
			_, err := db.Exec(`CREATE TABLE hand_processed (consumer TEXT NOT NULL, source TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (consumer, source, event_id));
				CREATE TABLE effects (source TEXT NOT NULL, event_id TEXT NOT NULL, text TEXT NOT NULL)`)
			if err != nil { // PostgreSQL takes one statement per Exec
				_, err = db.Exec(`CREATE TABLE hand_processed (consumer TEXT NOT NULL, source TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (consumer, source, event_id))`)
				require.NoError(b, err)
				_, err = db.Exec(`CREATE TABLE effects (source TEXT NOT NULL, event_id TEXT NOT NULL, text TEXT NOT NULL)`)
			}
			require.NoError(b, err)
			exists := db.Rebind(`SELECT count(*) FROM hand_processed WHERE consumer = ? AND source = ? AND event_id = ?`)
			insert := db.Rebind(`INSERT INTO effects (source, event_id, text) VALUES (?, ?, ?)`)
			mark := db.Rebind(`INSERT INTO hand_processed (consumer, source, event_id) VALUES (?, ?, ?)`)
			handler := func(msg *message.Message) ([]*message.Message, error) {
				var ev struct {
					ID     string `json:"id"`
					Source string `json:"source"`
					Data   struct {
						Text string `json:"text"`
					} `json:"data"`
				}
				if err := json.Unmarshal(msg.Payload, &ev); err != nil {
					return nil, err
				}
				if ev.ID == "" || ev.Data.Text == "" {
					return nil, errors.New("invalid")
				}
				ctx := msg.Context()
				tx, err := db.BeginTxx(ctx, nil)
				if err != nil {
					return nil, err
				}
				defer func() { _ = tx.Rollback() }()
				var n int
				if err := tx.GetContext(ctx, &n, exists, consumerName, ev.Source, ev.ID); err != nil {
					return nil, err
				}
				if n > 0 {
					return nil, nil
				}
				if _, err := tx.ExecContext(ctx, insert, ev.Source, ev.ID, ev.Data.Text); err != nil {
					return nil, err
				}
				if _, err := tx.ExecContext(ctx, mark, consumerName, ev.Source, ev.ID); err != nil {
					return nil, err
				}
				return nil, tx.Commit()
			}
			retry := wmmiddleware.Retry{MaxRetries: 2, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond, Multiplier: 1}
			h := retry.Middleware(wmmiddleware.Recoverer(wmmiddleware.Timeout(30 * time.Second)(handler)))

			bodies := make([][]byte, b.N)
			for i := range bodies {
				env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{ID: fmt.Sprint(i), Source: "bench"})
				require.NoError(b, err)
				bodies[i], err = framework.Encode(env)
				require.NoError(b, err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if _, err := h(message.NewMessage(fmt.Sprint(i), bodies[i])); err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "msgs/s")
		})
	}
}
