package sqlite

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Cleanup deletes, in batches, the messages that every consumer group
// known for their topic has acknowledged, and returns how many it deleted.
// A topic no group is registered for keeps all its messages. The
// Subscriber runs it every CleanupInterval.
func (s *Subscriber) Cleanup(ctx context.Context) (int64, error) {
	type horizon struct {
		topic  string
		offset int64
	}
	rows, err := s.db.QueryContext(ctx, s.q.horizons)
	if err != nil {
		return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
	}
	var hs []horizon
	for rows.Next() {
		var h horizon
		if err := rows.Scan(&h.topic, &h.offset); err != nil {
			_ = rows.Close()
			return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
		}
		hs = append(hs, h)
	}
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return 0, fmt.Errorf("cleanup: find acked messages: %w", err)
	}
	var total int64
	for _, h := range hs {
		for {
			res, err := s.db.ExecContext(ctx, s.q.cleanup, h.topic, h.offset, s.cfg.CleanupBatchSize)
			if err != nil {
				return total, fmt.Errorf("cleanup: delete acked messages of %s: %w", h.topic, err)
			}
			n, err := res.RowsAffected()
			if err != nil {
				return total, fmt.Errorf("cleanup: delete acked messages of %s: %w", h.topic, err)
			}
			total += n
			if n < int64(s.cfg.CleanupBatchSize) {
				break
			}
		}
	}
	return total, nil
}

func (s *Subscriber) cleanupLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CleanupInterval)
	defer t.Stop()
	for {
		select {
		case <-s.base.Done():
			return
		case <-t.C:
			n, err := s.Cleanup(s.base)
			switch {
			case err != nil && s.base.Err() == nil:
				s.log.Warn("sqlite pubsub cleanup failed", slog.Any("error", err))
			case n > 0:
				s.log.Debug("sqlite pubsub cleanup", slog.Int64("deleted", n))
			}
		}
	}
}
