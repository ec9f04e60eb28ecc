package app

import (
	"context"
	"fmt"
	"log/slog"

	"go.uber.org/fx"
)

// runInBackground runs run in a goroutine of its own from the
// application's start until its stop, which cancels run's context and
// waits for it to return, as long as the stop context allows. The hooks
// never block.
func runInBackground(lc fx.Lifecycle, name string, run func(ctx context.Context)) {
	var (
		cancel context.CancelFunc
		done   chan struct{}
	)
	lc.Append(fx.Hook{
		OnStart: func(context.Context) error {
			var ctx context.Context
			ctx, cancel = context.WithCancel(context.Background())
			done = make(chan struct{})
			go func() {
				defer close(done)
				run(ctx)
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			cancel()
			select {
			case <-done:
				return nil
			case <-ctx.Done():
				return fmt.Errorf("%s: stop: %w", name, ctx.Err())
			}
		},
	})
}

// orDiscard returns l, or a logger that discards when l is nil: the
// framework is quiet unless given a logger.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
