package app

import (
	"errors"
	"fmt"
	"os"
	"runtime/pprof"

	"go.uber.org/fx"
)

// profileCPU starts a CPU profile of the process into cfg.CPUProfile, when
// set, and stops it when the application stops. It is invoked before
// anything opens (the database, the transport), so the profile covers the
// start, and its stop hook, appended first, runs last. A file that cannot
// be created, or a profile already running in the process, fails the
// build, naming the setting; a build that fails later stops the profile
// with the hooks it undoes.
func profileCPU(lc fx.Lifecycle, cfg Config) error {
	if cfg.CPUProfile == "" {
		return nil
	}
	f, err := os.Create(cfg.CPUProfile)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvCPUProfile, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return fmt.Errorf("%s %s: %w", EnvCPUProfile, cfg.CPUProfile, errors.Join(err, f.Close()))
	}
	lc.Append(fx.StopHook(func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s %s: %w", EnvCPUProfile, cfg.CPUProfile, err)
		}
		return nil
	}))
	return nil
}
