package app

import (
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/internal/crash"
)

// relayCrashParams are what relayCrash takes from fx: the crash hook of
// the relays, which only the crash tests of this module supply
// (fx.Supply(crash.Relays{Hook: h})): the hook's type is internal, and a
// service never needs it.
type relayCrashParams struct {
	fx.In

	Relays crash.Relays `optional:"true"`
}

// relayCrash hands the service's relays, the outbox relay and the replay
// relay, the crash tests' hook, if any: they call it at their crash points
// (crash.BeforeOutboxSent, crash.BeforeReplayPublish,
// crash.BeforeReplaySent), where a hook that kills the process makes it
// die between a publication and its record. A delivery's crash points take
// their hook from the message's context instead (testkit.WithCrashHook).
func relayCrash(p relayCrashParams) relaysCrash { return relaysCrash{hook: p.Relays.Hook} }
