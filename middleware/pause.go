package middleware

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/outage"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// The reasons a message's attempts pause, in ConsumerStatus.Paused and
// the label reason of effectively_consumer_paused_messages.
const (
	// PausedDatabaseUnreachable: an attempt failed because the database
	// could not be reached, broke its connection or did not answer in
	// time, and it does not answer a ping either. The next attempt waits
	// until it does.
	PausedDatabaseUnreachable = "database unreachable"
	// PausedDatabaseFull: an attempt failed because the database has no
	// space left to write (PostgreSQL's disk_full, SQLite's SQLITE_FULL).
	// The attempt runs again every second until it fits.
	PausedDatabaseFull = "database full"
)

// outagePing bounds each ping that tells whether the database answers (see
// pauseFor), outagePause is the pause between two while it does not, and
// fullPause the pause before an attempt runs again on a full database.
const (
	outagePing  = time.Second
	outagePause = 250 * time.Millisecond
	fullPause   = time.Second
)

// pauseFor returns why the attempt that failed with err failed for no
// fault of its message, "" when it may be the message's fault:
// PausedDatabaseFull when err says the database has no space left
// (outage.Full); PausedDatabaseUnreachable when err says the database is
// unreachable or broke a connection (outage.Is), or that the attempt's
// time, or a statement's, ran out, and the database does not answer a
// ping now (a restart, or a black hole: a connection held open that
// answers nothing). A permanent error is the message's; so is one whose
// database answers (the next attempt, counted, gets a connection of its
// own).
func pauseFor(ctx context.Context, err error, ping func(context.Context) error) string {
	switch {
	case framework.IsPermanent(err) || errors.Is(err, pipeline.ErrLater) || ctx.Err() != nil:
		return ""
	case outage.Full(err):
		return PausedDatabaseFull
	case !outage.Is(err) && !timedOut(err):
		return ""
	}
	pctx, cancel := context.WithTimeout(ctx, outagePing)
	defer cancel()
	if ping(pctx) == nil {
		return ""
	}
	return PausedDatabaseUnreachable
}

// awaitOutage pauses the attempts of the message of st, whose try-th
// attempt failed with err for reason (see pauseFor): until the database
// answers a ping when unreachable, for fullPause when full. It returns
// nil when the next attempt may run, and errStopping or the message
// context's cause when the service stops or the message's delivery ends
// first. The message counts as paused (ConsumerStatus.Paused) until an
// attempt succeeds or its attempts end (see state.resume).
func awaitOutage(ctx context.Context, st *state, reason string, ping func(context.Context) error, stopping <-chan struct{}, try int, err error) error {
	st.pause(ctx, reason, err)
	pause := time.NewTimer(fullPause)
	defer pause.Stop()
	for {
		if reason == PausedDatabaseUnreachable {
			pctx, cancel := context.WithTimeout(ctx, outagePing)
			perr := ping(pctx)
			cancel()
			if perr == nil {
				return nil
			}
			pause.Reset(outagePause)
		}
		select {
		case <-pause.C:
			if reason == PausedDatabaseFull {
				return nil
			}
		case <-stopping:
			return stopped(try, err)
		case <-ctx.Done():
			return context.Cause(ctx)
		}
	}
}

// pause records that the message's attempts pause for reason, which err
// made them do; logged once per reason, not again for each attempt that
// fails alike while the outage lasts.
func (s *state) pause(ctx context.Context, reason string, err error) {
	if s.observer == nil || s.paused == reason {
		return
	}
	s.observer.paused(ctx, s, reason, err)
	s.paused = reason
	s.observer.track.pause(s.msg, s, reason)
}

// resume records that the message's pause, if any, ended: an attempt
// succeeded, or its attempts ended.
func (s *state) resume() {
	if s.paused == "" {
		return
	}
	s.paused = ""
	s.observer.track.resume(s)
}

// paused logs that the message of st pauses for reason.
func (o *observer) paused(ctx context.Context, st *state, reason string, err error) {
	if !o.logger.Enabled(ctx, slog.LevelWarn) {
		return
	}
	attrs := append(o.attrs(st), slog.String("reason", reason), slog.Int("attempt", st.attempts))
	o.logger.LogAttrs(ctx, slog.LevelWarn, "attempts paused, not charged: "+reason, append(attrs, errorAttrs(err, o.errorText)...)...)
}
