package faults_test

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
)

// keptLines is how many of a rig's last log lines a failed test prints.
const keptLines = 400

// rigLog keeps the log lines of a rig's instances, at Info and above,
// so that a failed fault test shows what its service did (and only
// its, while the other tests run beside it).
type rigLog struct {
	mu    sync.Mutex
	lines []string
}

// Write keeps p, one JSON line, dropping the oldest past keptLines.
func (l *rigLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) == keptLines {
		l.lines = append(l.lines[:0], l.lines[1:]...)
	}
	l.lines = append(l.lines, strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// logger returns instance i's logger.
func (l *rigLog) logger(i int) *slog.Logger {
	return slog.New(slog.NewJSONHandler(l, &slog.HandlerOptions{Level: slog.LevelInfo})).With("instance", i)
}

// warnings returns the last n lines kept at Warn and above.
func (l *rigLog) warnings(n int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var ws []string
	for _, line := range l.lines {
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			ws = append(ws, line)
		}
	}
	return ws[max(0, len(ws)-n):]
}

// printOnFailure prints the lines kept when t failed, once it ends.
func (l *rigLog) printOnFailure(t *testing.T) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		l.mu.Lock()
		defer l.mu.Unlock()
		t.Logf("the service's last %d log lines:\n%s", len(l.lines), strings.Join(l.lines, "\n"))
	})
}
