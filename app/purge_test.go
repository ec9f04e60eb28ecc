package app_test

import (
	"testing"
	"time"

	"github.com/effectively-once/effectively/app"
)

// TestPurger runs a service whose processed marks are kept for a moment
// only: the purger deletes them in the background.
func TestPurger(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	cfg.ProcessedRetention = app.Duration(time.Millisecond)
	cfg.PurgeInterval = app.Duration(20 * time.Millisecond)
	b := setup(t, cfg)
	b.publish(t, "e-1", "one")
	waitFor(t, "the effect", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 1 })
	waitFor(t, "the mark purged", func() bool { return b.count(t, `SELECT count(*) FROM processed_events`) == 0 })
}
