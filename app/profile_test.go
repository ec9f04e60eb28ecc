package app_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestCPUProfile shows that EFFECTIVELY_CPU_PROFILE makes the application
// write a CPU profile from its build to its stop that go tool pprof reads,
// and that a file it cannot create fails the build, naming the setting.
// Not parallel: a process has one CPU profile at a time.
func TestCPUProfile(t *testing.T) {
	t.Run("WrittenFromStartToStop", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "cpu.pprof")
		cfg, err := app.LoadConfig(env(t, "", map[string]string{app.EnvCPUProfile: path}))
		require.NoError(t, err)
		require.Equal(t, path, cfg.CPUProfile)
		test := testConfig(t)
		test.CPUProfile = cfg.CPUProfile
		b := setup(t, test)
		for i := range 20 {
			b.publish(t, "w-"+strconv.Itoa(i), "sprocket")
		}
		waitFor(t, "20 widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 20 })
		ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
		defer cancel()
		require.NoError(t, b.service.Stop(ctx))

		gobin, err := exec.LookPath("go")
		if err != nil {
			testenv.Missing(t, "no go command to read the profile with")
		}
		out, err := exec.Command(gobin, "tool", "pprof", "-top", path).CombinedOutput()
		require.NoError(t, err, "go tool pprof: %s", out)
		require.Contains(t, string(out), "Type: cpu")
	})

	t.Run("UncreatableFileFailsBuild", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.CPUProfile = filepath.Join(t.TempDir(), "missing", "cpu.pprof")
		service := app.New(
			handlers.Register(consumerName, handlers.On(widgetAdded, newAddWidget)),
			fx.Supply(widgetMigrations),
			fx.Replace(cfg),
		)
		require.ErrorContains(t, service.Err(), app.EnvCPUProfile+": open "+cfg.CPUProfile)
	})
}
