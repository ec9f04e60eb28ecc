package console

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/effectively-once/effectively/app/internal/bulk"
	"github.com/effectively-once/effectively/framework/driver"
)

// run replays or discards the pending dead letters j selects, after
// j.LastID, in the order of their ids, at j.Rate, recording its progress
// after each and a heartbeat every bulkHeartbeat. It stops when ctx ends:
// by cancel, for a job cancelled (its status says so already) or taken
// over, or by Close, which leaves it running in the database, to read as
// interrupted once its heartbeat is stale. An error of the store ends it
// interrupted, to be resumed.
func (c *Console) run(ctx context.Context, cancel context.CancelFunc, j driver.BulkJob) {
	var (
		mu sync.Mutex
		p  = j.BulkJobProgress
	)
	progress := func() driver.BulkJobProgress {
		mu.Lock()
		defer mu.Unlock()
		return p
	}
	// record records the progress and heartbeat, and stops the job when
	// it was cancelled or taken over.
	record := func() {
		st, err := c.jobs.ProgressBulkJob(ctx, j.ID, c.owner, progress())
		switch {
		case ctx.Err() != nil:
		case errors.Is(err, driver.ErrBulkJobLost):
			c.cfg.Logger.Warn("console: bulk job taken over by another process", "job", j.ID)
			cancel()
		case err != nil:
			c.cfg.Logger.Error("console: bulk job heartbeat", "job", j.ID, "error", err)
		case st == driver.BulkJobCancelled:
			cancel()
		}
	}
	var beats sync.WaitGroup
	beats.Go(func() {
		t := time.NewTicker(bulkHeartbeat)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				record()
			}
		}
	})
	err := c.each(ctx, j, func(dl driver.DeadLetter, refused bool) {
		mu.Lock()
		if refused {
			p.Refused++
		} else {
			p.Done++
		}
		p.LastID = dl.ID
		mu.Unlock()
		record()
	})
	cancel()
	beats.Wait()
	// The end is recorded even as the process stops: ctx has ended.
	end, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer stop()
	switch {
	case err == nil:
		if err := c.jobs.EndBulkJob(end, j.ID, c.owner, progress(), driver.BulkJobDone); err != nil {
			c.cfg.Logger.Error("console: end bulk job", "job", j.ID, "error", err)
			return
		}
		c.cfg.Logger.Info("console: bulk job ended", "job", j.ID, "progress", progress())
	case ctx.Err() != nil && c.ctx.Err() != nil:
		c.cfg.Logger.Info("console: bulk job stopped with the service: resume it", "job", j.ID, "progress", progress())
	case ctx.Err() != nil:
		// Cancelled or taken over: the progress of each dead letter is
		// recorded already.
	default:
		c.cfg.Logger.Error("console: bulk job interrupted", "job", j.ID, "error", err)
		if err := c.jobs.EndBulkJob(end, j.ID, c.owner, progress(), driver.BulkJobInterrupted); err != nil {
			c.cfg.Logger.Error("console: end bulk job", "job", j.ID, "error", err)
		}
	}
}

// each replays or discards the pending dead letters j selects after
// j.LastID, calling done after each, whether it was refused. It returns
// ctx's error when ctx ends first.
func (c *Console) each(ctx context.Context, j driver.BulkJob, done func(dl driver.DeadLetter, refused bool)) error {
	th := bulk.NewThrottle(j.Rate)
	f := j.Filter
	f.Status, f.Limit, f.WithoutBody, f.AfterID = driver.DeadLetterPending, bulkPage, true, j.LastID
	res := driver.Resolution{Status: driver.DeadLetterReplayed, By: j.By, Reason: j.Reason}
	if j.Kind == driver.BulkDiscard {
		res.Status = driver.DeadLetterDiscarded
	}
	for {
		dls, err := c.cfg.Store.DeadLetters(ctx, f)
		if err != nil {
			return err
		}
		for _, dl := range dls {
			if err := th.Wait(ctx); err != nil {
				return err
			}
			refused := j.Kind == driver.BulkReplay && c.cfg.RefuseReplay(dl, c.cfg.Now()) != ""
			if !refused {
				res.At = c.cfg.Now()
				_, err := c.cfg.Store.ResolveDeadLetter(ctx, dl.ID, res)
				switch {
				case errors.Is(err, driver.ErrNotPending), errors.Is(err, driver.ErrNotFound):
					refused = true // resolved by someone else since it was read
				case err != nil:
					return err
				}
			}
			done(dl, refused)
			if ctx.Err() != nil {
				return ctx.Err()
			}
		}
		if len(dls) < f.Limit {
			return nil
		}
		f.AfterID = dls[len(dls)-1].ID
	}
}
