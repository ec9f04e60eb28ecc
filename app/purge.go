package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
)

const (
	// purgeBatch is how many rows one purge statement deletes, each batch
	// in a short transaction of its own.
	purgeBatch = 1000
	// purgeLease names the lease that one process of the service holds
	// while it purges (framework.Purger.AcquireLease).
	purgeLease = "purge"
	// purgeLeaseTTL is how long the lease lasts unless renewed: a purger
	// renews it before each batch, and a purger that died frees it after
	// this long.
	purgeLeaseTTL = 2 * time.Minute
	// purgeReleaseStopping bounds the release of the lease by a purge cut
	// short by the service's stop.
	purgeReleaseStopping = 250 * time.Millisecond
)

// errPurgeBusy is returned by a purge while another process holds the
// purge's lease.
var errPurgeBusy = errors.New("another process of the service is purging (the lease \"purge\" is held): try again later")

// purger is the one purge of the service's database: the delivery counts
// of messages that finished, the processed marks older than
// Config.ProcessedRetention, the sent outbox rows and replays older than
// Config.OutboxRetention and Config.ReplayRetention, the resolved dead
// letters (with their history) older than Config.DeadLetterRetention. It
// deletes in batches of purgeBatch rows, each batch in a transaction of
// its own that records the kind's purge horizon, and holds a lease
// meanwhile, so that one process of the service purges at a time. The
// service runs it every Config.PurgeInterval; the purge command once.
type purger struct {
	store  framework.Purger // nil when the store cannot purge
	cfg    Config
	logger *slog.Logger
	holder string
	now    func() time.Time
	batch  int
}

// purgeStep is what a purge deletes of one kind: the rows older than
// before.
type purgeStep struct {
	Kind   framework.PurgeKind
	Before time.Time
	// Rows counts what was deleted, or with a dry run what would be.
	Rows int64
}

// newPurgerOf returns the purger of store with cfg's retentions.
func newPurgerOf(store framework.Store, cfg Config, logger *slog.Logger) *purger {
	p, _ := store.(framework.Purger)
	return &purger{
		store:  p,
		cfg:    cfg,
		logger: logger.With("component", "purger"),
		holder: leaseHolder(),
		now:    time.Now,
		batch:  purgeBatch,
	}
}

// leaseHolder names this process as a lease's holder: host, pid and a
// random part, unique across processes and purgers.
func leaseHolder() string {
	host, _ := os.Hostname()
	var b [6]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
}

// purgerParams are what newPurger takes from fx.
type purgerParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Store     framework.Store
	Logger    *slog.Logger `optional:"true"`
}

// newPurger returns the purger and runs it from the application's start
// to its stop, every Config.PurgeInterval.
func newPurger(p purgerParams) *purger {
	pu := newPurgerOf(p.Store, p.Config, orDefault(p.Logger))
	if pu.store != nil {
		runInBackground(p.Lifecycle, "purger", pu.run)
	}
	return pu
}

func (pu *purger) run(ctx context.Context) {
	tick := time.NewTicker(time.Duration(pu.cfg.PurgeInterval))
	defer tick.Stop()
	for {
		steps, err := pu.purge(ctx)
		switch {
		case errors.Is(err, errPurgeBusy):
			pu.logger.DebugContext(ctx, "purge skipped: another process purges")
		case err != nil && ctx.Err() == nil:
			pu.logger.ErrorContext(ctx, "purge failed; trying again at the next interval", "error", err)
		}
		if attrs := purgedAttrs(steps); len(attrs) > 0 {
			pu.logger.InfoContext(ctx, "purged", attrs...)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// purgedAttrs are the log attributes of what a purge deleted: a count per
// kind that lost rows.
func purgedAttrs(steps []purgeStep) []any {
	var attrs []any
	for _, s := range steps {
		if s.Rows > 0 {
			attrs = append(attrs, string(s.Kind), s.Rows)
		}
	}
	return attrs
}

// steps returns what a purge at now deletes, in order: the delivery
// counts first, while the marks that show their message finished exist.
// The counts first made before the processed-mark retention go too: a
// message still failing after that long is past any redelivery its mark
// would have caught.
func (pu *purger) steps(now time.Time) []purgeStep {
	var marks time.Time
	if pu.cfg.ProcessedRetention > 0 {
		marks = now.Add(-time.Duration(pu.cfg.ProcessedRetention))
	}
	steps := []purgeStep{{Kind: framework.PurgeDeliveries, Before: marks}}
	if !marks.IsZero() {
		steps = append(steps, purgeStep{Kind: framework.PurgeProcessed, Before: marks})
	}
	return append(steps,
		purgeStep{Kind: framework.PurgeOutbox, Before: now.Add(-time.Duration(pu.cfg.OutboxRetention))},
		purgeStep{Kind: framework.PurgeReplays, Before: now.Add(-time.Duration(pu.cfg.ReplayRetention))},
		purgeStep{Kind: framework.PurgeDeadLetters, Before: now.Add(-time.Duration(pu.cfg.DeadLetterRetention))},
	)
}

// purge takes the lease, deletes every step's rows in batches, renewing
// the lease before each, and releases it. It returns what it deleted,
// errPurgeBusy when another process holds the lease, and stops when it
// loses the lease or ctx ends.
func (pu *purger) purge(ctx context.Context) ([]purgeStep, error) {
	if pu.store == nil {
		return nil, errors.New("purge: the store cannot purge (it does not implement framework.Purger)")
	}
	defer func() {
		// Released even when ctx ended, and even when taking it failed:
		// an acquisition cut short by a stop may have committed all the
		// same, and the next purge need not wait for the lease's end.
		// Releasing a lease this purger does not hold changes nothing.
		// While the service stops it waits only briefly: behind an
		// attempt that holds the SQLite file's write lock, the release
		// took the 5 s from the stop that the attempt's drain needs, and
		// a lease not released ends by itself (purgeLeaseTTL).
		timeout := 5 * time.Second
		if ctx.Err() != nil {
			timeout = purgeReleaseStopping
		}
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
		defer cancel()
		switch err := pu.store.ReleaseLease(rctx, purgeLease, pu.holder); {
		case err != nil && ctx.Err() != nil:
			pu.logger.InfoContext(ctx, "purge: the lease was not released while stopping; it ends by itself", "error", err, "within", purgeLeaseTTL)
		case err != nil:
			pu.logger.WarnContext(ctx, "purge: release the lease", "error", err)
		}
	}()
	if err := pu.lease(ctx); err != nil {
		return nil, err
	}
	steps := pu.steps(pu.now())
	for i := range steps {
		for {
			n, err := pu.store.PurgeBatch(ctx, steps[i].Kind, steps[i].Before, pu.batch)
			steps[i].Rows += n
			if err != nil {
				return steps, fmt.Errorf("purge: %w", err)
			}
			if n < int64(pu.batch) {
				break
			}
			if err := pu.lease(ctx); err != nil {
				return steps, err
			}
		}
	}
	return steps, nil
}

// lease takes or renews the purge's lease: errPurgeBusy when another
// process holds it.
func (pu *purger) lease(ctx context.Context) error {
	ok, err := pu.store.AcquireLease(ctx, purgeLease, pu.holder, purgeLeaseTTL)
	switch {
	case err != nil:
		return fmt.Errorf("purge: %w", err)
	case !ok:
		return errPurgeBusy
	}
	return nil
}

// dryRun counts what purge would delete now, deleting nothing.
func (pu *purger) dryRun(ctx context.Context) ([]purgeStep, error) {
	if pu.store == nil {
		return nil, errors.New("purge: the store cannot purge (it does not implement framework.Purger)")
	}
	steps := pu.steps(pu.now())
	for i := range steps {
		n, err := pu.store.Purgeable(ctx, steps[i].Kind, steps[i].Before)
		if err != nil {
			return steps, fmt.Errorf("purge: %w", err)
		}
		steps[i].Rows = n
	}
	return steps, nil
}

// purgeCommand returns the purge command: one purge now, or with
// --dry-run what it would delete.
func purgeCommand(opts fx.Option) *cobra.Command {
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete what is past its retention, once (the service does it every purge_interval)",
		Long: `Delete, in batches, the delivery counts of messages that finished, the
processed marks older than processed_retention, the outbox rows sent longer
ago than outbox_retention, the replays sent longer ago than
replay_retention, and the dead letters replayed or discarded longer ago than
dead_letter_retention with their history (pending ones never). One process
of the service purges at a time: while another does, the command exits 1.
With --dry-run it prints what it would delete, and deletes nothing.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return operate(cmd.Context(), opts, func(ctx context.Context, op operator) error {
				pu := newPurgerOf(op.deadLetters, op.cfg, slog.New(slog.DiscardHandler))
				run, verb := pu.purge, "deleted"
				if dryRun {
					run, verb = pu.dryRun, "would delete"
				}
				steps, err := run(ctx)
				if perr := printPurge(cmd.OutOrStdout(), steps, verb); err == nil {
					err = perr
				}
				return err
			})
		},
	}
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "print what the purge would delete, and delete nothing")
	return cmd
}

// purgeWhat says what each kind of purge deletes, for the command's
// table.
var purgeWhat = map[framework.PurgeKind]string{
	framework.PurgeDeliveries:  "delivery counts of finished messages",
	framework.PurgeProcessed:   "processed marks",
	framework.PurgeOutbox:      "sent outbox rows",
	framework.PurgeReplays:     "sent replays",
	framework.PurgeDeadLetters: "resolved dead letters",
}

// printPurge prints a row per step: what, older than when, how many.
func printPurge(out io.Writer, steps []purgeStep, verb string) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "WHAT\tOLDER THAN\t%s\n", verb)
	for _, s := range steps {
		before := "(finished)"
		if !s.Before.IsZero() {
			before = s.Before.UTC().Format(time.RFC3339)
			if s.Kind == framework.PurgeDeliveries {
				before += " or finished"
			}
		}
		fmt.Fprintf(w, "%s\t%s\t%d\n", purgeWhat[s.Kind], before, s.Rows)
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("print: %w", err)
	}
	return nil
}
