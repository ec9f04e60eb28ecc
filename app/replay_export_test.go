package app

import (
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/internal/crash"
)

// ReplayCrash supplies the service's replay relay the crash hook h, which
// it calls at its crash points (crash.BeforeReplayPublish,
// crash.BeforeReplaySent), for the tests of package app_test.
func ReplayCrash(h crash.Hook) fx.Option { return fx.Supply(crash.Relays{Hook: h}) }
