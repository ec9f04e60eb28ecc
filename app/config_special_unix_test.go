//go:build unix

package app_test

import (
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// TestLoadConfigFIFO: EFFECTIVELY_CONFIG naming a named pipe blocked
// LoadConfig until another process wrote to it; it is refused, naming
// the setting, at once.
func TestLoadConfigFIFO(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, syscall.Mkfifo(path, 0o600))
	done := make(chan error, 1)
	go func() {
		_, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: path}))
		done <- err
	}()
	select {
	case err := <-done:
		require.ErrorContains(t, err, app.EnvConfig+": "+path+" is a named pipe (FIFO), not a regular file")
	case <-time.After(10 * time.Second):
		t.Fatal("LoadConfig blocked on a named pipe")
	}
}

// TestLoadConfigZero: EFFECTIVELY_CONFIG naming /dev/zero, a device that
// never ends, was read until the process ran out of memory; it is
// refused, naming the setting, before it is read.
func TestLoadConfigZero(t *testing.T) {
	t.Parallel()
	_, err := app.LoadConfig(env(t, "", map[string]string{app.EnvConfig: "/dev/zero"}))
	require.ErrorContains(t, err, app.EnvConfig+": /dev/zero is a device, not a regular file")
}
