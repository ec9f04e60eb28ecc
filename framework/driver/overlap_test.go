package driver_test

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// span is when one run of a handler began and ended, and the transaction
// it wrote in.
type span struct {
	start, end time.Time
	txid       string
}

// overlap reports whether two of spans overlap in time.
func overlap(spans []span) bool {
	spans = slices.Clone(spans)
	slices.SortFunc(spans, func(a, b span) int { return a.start.Compare(b.start) })
	for i := 1; i < len(spans); i++ {
		if spans[i].start.Before(spans[i-1].end) {
			return true
		}
	}
	return false
}

// TestOutsideCallsOverlap shows group commit adapting to where the
// attempts' time goes, at the default Overlap. Four attempts whose
// handler waits 20 ms outside the database (an HTTP call) first share a
// batch, one after another: from then on the consumer's attempts
// overlap on PostgreSQL, their transactions begun at their handlers'
// first statements, and every effect commits once. Once the handlers' time goes to the database
// again, the attempts share batches again. SQLite has one writer: its
// attempts keep sharing batches.
func TestOutsideCallsOverlap(t *testing.T) {
	t.Parallel()
	for name, open := range groupBackends() {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			b := open(t)
			// Batches of 4 that wait until they are full: each round's
			// four attempts would share one.
			uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store, BatchSize: 4, Batches: 1, Linger: time.Hour})
			require.NoError(t, err)
			var mu sync.Mutex
			round := func(prefix string, wait time.Duration) []span {
				var (
					spans []span
					wg    sync.WaitGroup
				)
				for i := range 4 {
					id := fmt.Sprint(prefix, i)
					wg.Go(func() {
						outcome, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
							start := time.Now()
							time.Sleep(wait) // the outside call
							conn := framework.Conn(ctx, b.db)
							if _, err := conn.ExecContext(ctx, b.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id); err != nil {
								return err
							}
							txid, err := b.txid(ctx, conn)
							mu.Lock()
							spans = append(spans, span{start: start, end: time.Now(), txid: txid})
							mu.Unlock()
							return err
						})
						require.NoError(t, err)
						require.Equal(t, framework.Processed, outcome)
					})
				}
				wg.Wait()
				return spans
			}
			txids := func(spans []span) int {
				ids := map[string]bool{}
				for _, s := range spans {
					ids[s.txid] = true
				}
				return len(ids)
			}

			first := round("learn-", 20*time.Millisecond)
			require.Equal(t, 1, txids(first), "one batch: the consumer's handlers have not waited yet")
			require.False(t, overlap(first), "a batch runs its attempts one after another")

			// The pool keeps four connections ready: a connection
			// dialed as an attempt begins (SCRAM's exchange takes tens of
			// milliseconds on a loaded machine) would start its outside
			// call after the others had ended.
			b.db.SetMaxIdleConns(4)
			conns := make([]*sql.Conn, 4)
			for i := range conns {
				conns[i], err = b.db.Conn(ctx)
				require.NoError(t, err)
			}
			for _, c := range conns {
				require.NoError(t, c.Close())
			}
			second := round("outside-", 20*time.Millisecond)
			if name == "SQLite" {
				require.False(t, driver.Overlapping(uow))
				require.Equal(t, 1, txids(second), "SQLite: one writer, the attempts share a batch still")
				require.False(t, overlap(second))
			} else {
				require.True(t, driver.Overlapping(uow))
				// Their transactions begin at their first statements:
				// those that reach theirs while a batch runs share the
				// next one (TestDeferredAttemptsShareBatches).
				require.True(t, overlap(second), "the outside calls overlap: %v", second)

				// Handlers that go straight to the database bring the
				// batches back.
				// Each runs alone, the attempts overlapping still, until
				// the moving average falls below half the threshold.
				for i := 0; driver.Overlapping(uow); i++ {
					require.Less(t, i, 100, "the attempts still overlap")
					_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: fmt.Sprint("db-", i)}, func(context.Context) error { return nil })
					require.NoError(t, err)
				}
				require.Equal(t, 1, txids(round("again-", 0)), "one batch again")
			}
			var n int
			require.NoError(t, b.db.GetContext(ctx, &n, `SELECT count(*) FROM effects`))
			require.Equal(t, 8+map[string]int{"SQLite": 0, "PostgreSQL": 4}[name], n, "each effect once")
		})
	}
}

// BenchmarkOutsideCall runs 64 attempts at a time whose handler waits
// 10 ms outside the database (an HTTP call) and then inserts its effect,
// at the default settings (the attempts overlap), at BatchSize 1, and
// with Overlap 1 (batches whatever the handlers do, as before).
func BenchmarkOutsideCall(b *testing.B) {
	for name, open := range groupBackends() {
		for _, cfg := range []struct {
			name string
			uow  driver.UnitOfWorkConfig
		}{
			{"Default", driver.UnitOfWorkConfig{}},
			{"BatchSize1", driver.UnitOfWorkConfig{BatchSize: 1}},
			{"Overlap1", driver.UnitOfWorkConfig{Overlap: 1}},
		} {
			b.Run(name+"/"+cfg.name, func(b *testing.B) {
				bk := open(b)
				bk.db.SetMaxOpenConns(80) // as the application sizes its pool
				bk.db.SetMaxIdleConns(80)
				cfg.uow.DB, cfg.uow.Store = bk.db, bk.store
				uow, err := driver.NewUnitOfWork(cfg.uow)
				require.NoError(b, err)
				var n atomic.Int64
				b.SetParallelism(64 / runtime.GOMAXPROCS(0))
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						id := strconv.FormatInt(n.Add(1), 10)
						_, err := uow.Do(context.Background(), "c", framework.Key{Source: "s", ID: id}, func(ctx context.Context) error {
							time.Sleep(10 * time.Millisecond)
							_, err := framework.Conn(ctx, bk.db).ExecContext(ctx, bk.db.Rebind(`INSERT INTO effects (id, seen) VALUES (?, 1)`), id)
							return err
						})
						if err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "effects/s")
			})
		}
	}
}
