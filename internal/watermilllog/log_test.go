package watermilllog_test

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/watermilllog"
)

// TestLevels: each level logs what watermill's adapter logs when slog
// enables it, with the fields and those of With, and nothing below the
// handler's level.
func TestLevels(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		level slog.Level
		want  []string // the messages logged, in order
	}{
		{watermill.LevelTrace, []string{"trace", "debug", "info", "error"}},
		{slog.LevelDebug, []string{"debug", "info", "error"}},
		{slog.LevelInfo, []string{"info", "error"}},
		{slog.LevelError, []string{"error"}},
		{slog.LevelError + 1, nil},
	} {
		t.Run(c.level.String(), func(t *testing.T) {
			t.Parallel()
			var buf bytes.Buffer
			l := watermilllog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: c.level}))).
				With(watermill.LogFields{"handler_name": "h"})
			fields := watermill.LogFields{"message_uuid": "u-1"}
			l.Trace("trace", fields)
			l.Debug("debug", fields)
			l.Info("info", fields)
			l.Error("error", errors.New("boom"), fields)
			var got []string
			for line := range strings.Lines(buf.String()) {
				require.Contains(t, line, "handler_name=h")
				require.Contains(t, line, "message_uuid=u-1")
				_, rest, ok := strings.Cut(line, "msg=")
				require.True(t, ok, line)
				got = append(got, strings.Fields(rest)[0])
			}
			require.Equal(t, c.want, got)
			if len(c.want) > 0 {
				require.Contains(t, buf.String(), "error=boom")
			}
		})
	}
}

// TestDisabledAllocatesNothing: a level slog drops costs no allocation,
// which is why the package exists.
func TestDisabledAllocatesNothing(t *testing.T) {
	l := watermilllog.New(slog.New(slog.NewTextHandler(&bytes.Buffer{}, &slog.HandlerOptions{Level: slog.LevelInfo})))
	fields := watermill.LogFields{"message_uuid": "u-1", "handler_name": "h"}
	require.Zero(t, testing.AllocsPerRun(100, func() {
		l.Trace("Received message", fields)
		l.Debug("debug", fields)
	}))
}

func TestNilIsDefault(t *testing.T) {
	t.Parallel()
	require.NotPanics(t, func() { watermilllog.New(nil).Trace("dropped", nil) })
}

// TestRouterLineOfAWaitIsDebug: the router's "Handler returned error" of a
// message delivered again on purpose (pipeline.ErrLater: a strict_order
// wait, a breaker's hold), which the chain logs at info, is logged at
// debug; any other error of the router at error.
func TestRouterLineOfAWaitIsDebug(t *testing.T) {
	t.Parallel()
	for _, level := range []slog.Level{slog.LevelInfo, slog.LevelDebug} {
		var buf bytes.Buffer
		l := watermilllog.New(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})))
		fields := watermill.LogFields{"message_uuid": "u-1"}
		l.Error("Handler returned error", fmt.Errorf("inv-1 #2 waits for #1: %w", pipeline.ErrLater), fields)
		l.Error("Handler returned error", errors.New("boom"), fields)
		lines := slices.Collect(strings.Lines(buf.String()))
		if level == slog.LevelInfo {
			require.Len(t, lines, 1, buf.String())
		} else {
			require.Len(t, lines, 2, buf.String())
			require.Contains(t, lines[0], "level=DEBUG")
			require.Contains(t, lines[0], "waits for #1")
		}
		require.Contains(t, lines[len(lines)-1], "level=ERROR")
		require.Contains(t, lines[len(lines)-1], "error=boom")
	}
}
