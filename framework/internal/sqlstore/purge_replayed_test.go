package sqlstore_test

import (
	"context"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
)

// TestPurgeKeepsUnpublishedReplays: a dead letter replayed before the
// purge's time is not purged while its replay waits to be published, so
// that a replay that fails again joins its row and history instead of
// starting a new dead letter without them; once the replay went out, the
// dead letter is purged. Purgeable counts the same.
func TestPurgeKeepsUnpublishedReplays(t *testing.T) {
	eachDatabase(t, func(ctx context.Context, t *testing.T, db *sqlx.DB, d sqlstore.Dialect) {
		now := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
		s, err := sqlstore.New(db, d, sqlstore.Options{Now: func() time.Time { return now }})
		require.NoError(t, err)
		for _, id := range []string{"replayed", "discarded"} {
			require.NoError(t, s.PublishDeadLetter(ctx, driver.DeadLetter{
				Consumer: "c", Topic: "t", Source: "s", EventID: id, Code: framework.CodeInvalidPayload,
				Body: []byte(`{"id":"` + id + `"}`),
			}))
		}
		dls, err := s.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: "c"})
		require.NoError(t, err)
		require.Len(t, dls, 2)
		for _, dl := range dls {
			status := driver.DeadLetterDiscarded
			if dl.EventID == "replayed" {
				status = driver.DeadLetterReplayed
			}
			_, err := s.ResolveDeadLetter(ctx, dl.ID, driver.Resolution{Status: status, By: "alice", Reason: "test"})
			require.NoError(t, err)
		}

		before := now.Add(time.Hour)
		n, err := s.Purgeable(ctx, driver.PurgeDeadLetters, before)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "the discarded one only")
		n, err = s.PurgeBatch(ctx, driver.PurgeDeadLetters, before, 100)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		left, err := s.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: "c", Status: driver.DeadLetterReplayed})
		require.NoError(t, err)
		require.Len(t, left, 1, "the replayed one waits for its replay")

		replays, err := s.ClaimReplays(ctx, 10, time.Minute)
		require.NoError(t, err)
		require.Len(t, replays, 1)
		require.NoError(t, s.ReplaySent(ctx, replays[0].ID))
		n, err = s.Purgeable(ctx, driver.PurgeDeadLetters, before)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		n, err = s.PurgeBatch(ctx, driver.PurgeDeadLetters, before, 100)
		require.NoError(t, err)
		require.EqualValues(t, 1, n, "purged once its replay went out")
	})
}
