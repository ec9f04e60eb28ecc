package app

import (
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/internal/crash"
)

// RelayCrash supplies the service's relays, the outbox relay and the
// replay relay, the crash hook h: they call it at their crash points
// (crash.BeforeOutboxSent, crash.BeforeReplayPublish,
// crash.BeforeReplaySent), where a hook that kills the process makes it
// die between a publication and its record. It is for the crash tests of
// this module only (the hook's type is internal): a service never needs
// it. A delivery's crash points take their hook from the message's
// context instead (testkit.WithCrashHook).
func RelayCrash(h crash.Hook) fx.Option { return fx.Supply(replayCrash{hook: h}) }
