package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
)

// The crash matrix's mode (see crash_matrix_test.go): the process dies
// with SIGKILL at any crash point named in the environment, of the
// deliveries or of the service's relays.
const (
	// modePoints kills the process once at each point of envCrashAt,
	// the first time the process reaches it (one marker file per point,
	// see pointMarker): a run kills at most once, so a list of points
	// takes as many runs.
	modePoints = "points"
	// envCrashAt names the points of modePoints, comma-separated, as
	// internal/crash names them (after_decode, before_outbox_sent...).
	envCrashAt = "EFFECTIVELY_CRASH_AT"
	// envCrashEvent, when set, restricts the kills of modePoints to the
	// deliveries of that event id. The relays' points carry no event:
	// they kill whatever it says.
	envCrashEvent = "EFFECTIVELY_CRASH_EVENT"
	// envCrashReject, when set, names a file: while it exists the
	// handler fails the event of envCrashEvent permanently, which makes
	// it a dead letter that the test then replays (see rejecting).
	envCrashReject = "EFFECTIVELY_CRASH_REJECT"
)

// codeRejected is the code of the dead letters of rejecting.
const codeRejected framework.Code = "rejected_by_test"

// rejecting returns newHandler's handler, which fails the event event
// permanently while the file reject exists; with either empty, the
// handler itself.
func rejecting(reject, event string, newHandler func(*sqlx.DB) framework.HandlerFunc[appointments.BookedV1]) func(*sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
	if reject == "" || event == "" {
		return newHandler
	}
	return func(db *sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
		h := newHandler(db)
		return func(ctx context.Context, ev framework.Event[appointments.BookedV1]) error {
			if _, err := os.Stat(reject); err == nil && ev.ID == event {
				return framework.Permanent(codeRejected, errors.New("rejected while "+reject+" exists"))
			}
			return h(ctx, ev)
		}
	}
}

// pointMarker names the marker file of point p: it exists once the hook
// killed a process there.
func pointMarker(marker string, p testkit.CrashPoint) string {
	return marker + "." + string(p)
}

// pointsHook returns the hook of modePoints.
func pointsHook(marker, at, event string) (testkit.CrashHook, error) {
	if marker == "" || at == "" {
		return nil, fmt.Errorf("%s: mode %s needs %s and %s", envCrashMode, modePoints, envCrashMarker, envCrashAt)
	}
	var points []testkit.CrashPoint
	for _, p := range strings.Split(at, ",") {
		points = append(points, testkit.CrashPoint(strings.TrimSpace(p)))
	}
	return func(ctx context.Context, p testkit.CrashPoint) bool {
		if !slices.Contains(points, p) {
			return false
		}
		if env, ok := framework.EnvelopeFromContext(ctx); ok && event != "" && env.ID != event {
			return false
		}
		if firstTime(pointMarker(marker, p)) {
			killSelf()
		}
		return false
	}, nil
}
