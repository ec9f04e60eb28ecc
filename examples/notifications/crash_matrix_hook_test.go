package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/effectively-once/effectively/app/testkit"
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
)

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
