package app

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx/fxtest"
)

// sqliteHeader is how a SQLite database file begins.
const sqliteHeader = "SQLite format 3\x00"

// TestProfileCPURefusesToOverwrite: EFFECTIVELY_CPU_PROFILE pointed at
// the database file overwrote it with the profile. A file that is not
// empty and not a CPU profile (gzip), or not a regular file, is refused,
// naming the setting, and left as it was.
func TestProfileCPURefusesToOverwrite(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, content, want string
	}{
		{"Database", sqliteHeader + strings.Repeat("\x00", 4080), "exists and is not a CPU profile"},
		{"Text", "notes\n", "exists and is not a CPU profile"},
		{"OneByteOfGzip", "\x1f", "exists and is not a CPU profile"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "app.db")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			err := profileCPU(fxtest.NewLifecycle(t), Config{CPUProfile: path})
			require.ErrorContains(t, err, EnvCPUProfile+": "+path+" "+tt.want)
			kept, err := os.ReadFile(path)
			require.NoError(t, err)
			require.Equal(t, tt.content, string(kept), "the file is left as it was")
		})
	}
	t.Run("Directory", func(t *testing.T) {
		t.Parallel()
		dir := t.TempDir()
		err := profileCPU(fxtest.NewLifecycle(t), Config{CPUProfile: dir})
		require.ErrorContains(t, err, EnvCPUProfile+": "+dir+" is a directory, not a regular file")
	})
	t.Run("Device", func(t *testing.T) {
		t.Parallel()
		err := profileCPU(fxtest.NewLifecycle(t), Config{CPUProfile: os.DevNull})
		require.ErrorContains(t, err, EnvCPUProfile+": "+os.DevNull+" is a device, not a regular file")
	})
}

// TestProfileCPUOverwritesProfile: a service run again with the same
// setting writes its profile over the last one's, and into an empty file
// made for it. Not parallel: a process has one CPU profile at a time.
func TestProfileCPUOverwritesProfile(t *testing.T) {
	for _, tt := range []struct{ name, content string }{
		{"LastProfile", "\x1f\x8b" + strings.Repeat("x", 10000)},
		{"Empty", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "cpu.pprof")
			require.NoError(t, os.WriteFile(path, []byte(tt.content), 0o600))
			lc := fxtest.NewLifecycle(t)
			require.NoError(t, profileCPU(lc, Config{CPUProfile: path}))
			lc.RequireStart().RequireStop()
			written, err := os.ReadFile(path)
			require.NoError(t, err)
			require.True(t, strings.HasPrefix(string(written), gzipMagic), "a profile")
			require.NotContains(t, string(written), strings.Repeat("x", 100), "the last profile's bytes are gone")
		})
	}
}
