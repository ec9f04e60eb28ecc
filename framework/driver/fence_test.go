package driver_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/crash"
)

// fenceProbe is a driver.Fencer that lets every attempt through, and
// records the idle timeout of each transaction it checks in
// (PostgreSQL's SHOW idle_in_transaction_session_timeout).
type fenceProbe struct {
	mu   sync.Mutex
	idle []string
}

func (f *fenceProbe) Fence(ctx context.Context, tx *driver.Tx, _ []int) error {
	var idle string
	if err := tx.GetContext(ctx, &idle, `SHOW idle_in_transaction_session_timeout`); err != nil {
		return err
	}
	f.mu.Lock()
	f.idle = append(f.idle, idle)
	f.mu.Unlock()
	return nil
}

func (f *fenceProbe) seen() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.idle...)
}

// TestFence runs the attempts of a partitioned consumer's deliveries on
// PostgreSQL, alone and in a batch: each transaction that checks the
// fence ends idle past its deadline (idle_in_transaction_session_timeout
// set), so that a process frozen between its fence and its commit holds
// the lease's row no longer; and an attempt that dies at crash point
// AfterFence, the fence passed, commits nothing.
func TestFence(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		batch bool
	}{{"Alone", false}, {"Batch", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := groupBackends()["PostgreSQL"](t)
			uow := b.unitOfWork(t)
			if !tc.batch {
				var err error
				uow, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: b.db, Store: b.store})
				require.NoError(t, err)
			}
			probe := &fenceProbe{}
			d := driver.Delivery{Fencer: probe, Partition: 1}
			// run runs the attempts of ids at once, as a batch when tc
			// says; those in die die at AfterFence.
			run := func(ids []string, die map[string]bool) ([]framework.Outcome, []error) {
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				outcomes, errs := make([]framework.Outcome, len(ids)), make([]error, len(ids))
				attempt := func(i int) {
					actx := ctx
					if die[ids[i]] {
						actx = crash.With(ctx, func(_ context.Context, p crash.Point) bool { return p == crash.AfterFence })
					}
					outcomes[i], errs[i] = uow.DoDelivery(actx, "c", framework.Key{Source: "s", ID: ids[i]}, d,
						func(ctx context.Context) error { return b.insert(ctx, ids[i]) })
				}
				if !tc.batch {
					for i := range ids {
						attempt(i)
					}
					return outcomes, errs
				}
				// A first attempt holds the only batch slot until the
				// others wait, so that they run as one batch.
				started, release, held := make(chan struct{}), make(chan struct{}), make(chan error, 1)
				go func() {
					_, err := uow.Do(ctx, "c", framework.Key{Source: "s", ID: "holder-" + ids[0]}, func(context.Context) error {
						close(started)
						<-release
						return nil
					})
					held <- err
				}()
				<-started
				var wg sync.WaitGroup
				for i := range ids {
					wg.Go(func() { attempt(i) })
					require.Eventually(t, func() bool { return driver.Waiting(uow) == i+1 }, 10*time.Second, time.Millisecond)
				}
				close(release)
				require.NoError(t, <-held)
				wg.Wait()
				return outcomes, errs
			}

			outcomes, errs := run([]string{"a", "b"}, nil)
			require.NoError(t, errs[0])
			require.NoError(t, errs[1])
			require.Equal(t, []framework.Outcome{framework.Processed, framework.Processed}, outcomes)
			idle := probe.seen()
			require.NotEmpty(t, idle, "the fence was checked")
			for _, v := range idle {
				require.NotEqual(t, "0", v, "the transaction that checked the fence has an idle timeout")
			}

			outcomes, errs = run([]string{"c", "d"}, map[string]bool{"c": true})
			at, ok := crash.PointOf(errs[0])
			require.True(t, ok, "c died: %v", errs[0])
			require.Equal(t, crash.AfterFence, at)
			require.Equal(t, framework.Failed, outcomes[0])
			var got []string
			require.NoError(t, b.db.SelectContext(t.Context(), &got, `SELECT id FROM effects ORDER BY id`))
			if tc.batch { // d shared c's batch, which died with it
				require.Equal(t, framework.Failed, outcomes[1])
				require.Equal(t, []string{"a", "b"}, got, "nothing of the batch that died after its fence committed")
			} else {
				require.NoError(t, errs[1])
				require.Equal(t, []string{"a", "b", "d"}, got, "nothing of the attempt that died after its fence committed")
			}
		})
	}
}

// TestFenceCheck: a fence holds only for its member, with its token, on
// a live lease; every other case wraps driver.ErrFenced and says why.
func TestFenceCheck(t *testing.T) {
	f := driver.Fence{Partition: 3, Token: 7}
	held := func(owner string, token int64) *driver.PartitionLease {
		return &driver.PartitionLease{Consumer: "c", Partition: 3, Owner: owner, Token: token}
	}
	require.NoError(t, f.Check("c", "me", held("me", 7), true))
	for _, tc := range []struct {
		lease *driver.PartitionLease
		live  bool
		why   string
	}{
		{nil, false, "no one ever held it"},
		{held("", 7), true, "it was released"},
		{held("other", 8), true, "other holds it"},
		{held("me", 8), true, "its token is 8 now"},
		{held("me", 7), false, "the lease expired"},
	} {
		err := f.Check("c", "me", tc.lease, tc.live)
		require.ErrorIs(t, err, driver.ErrFenced)
		require.ErrorContains(t, err, "partition 3 of c, fenced by me with token 7: "+tc.why)
	}
}
