package testkit

import (
	"testing"

	"github.com/effectively-once/effectively/framework"
)

// RequireOutcome fails the test unless res has outcome want.
func RequireOutcome(t testing.TB, res Result, want framework.Outcome) {
	t.Helper()
	if res.Outcome != want {
		t.Fatalf("testkit: want the message %s, got %s", want, res)
	}
}

// RequireProcessed fails the test unless the handler's effect committed.
func RequireProcessed(t testing.TB, res Result) {
	t.Helper()
	RequireOutcome(t, res, framework.Processed)
}

// RequireDuplicate fails the test unless the delivery was recognised as a
// duplicate and acknowledged without running the handler.
func RequireDuplicate(t testing.TB, res Result) {
	t.Helper()
	RequireOutcome(t, res, framework.Duplicate)
}

// RequireStale fails the test unless the sequence guard skipped the event
// as older than its subject's checkpoint.
func RequireStale(t testing.TB, res Result) {
	t.Helper()
	RequireOutcome(t, res, framework.Stale)
}

// RequireNacked fails the test unless the message was left for a
// redelivery.
func RequireNacked(t testing.TB, res Result) {
	t.Helper()
	RequireOutcome(t, res, framework.Nacked)
}

// RequireDeadLettered fails the test unless the message was dead-lettered
// with code.
func RequireDeadLettered(t testing.TB, res Result, code framework.Code) {
	t.Helper()
	if res.Outcome != framework.DeadLettered || res.Code != code {
		t.Fatalf("testkit: want the message dead_lettered (%s), got %s", code, res)
	}
}
