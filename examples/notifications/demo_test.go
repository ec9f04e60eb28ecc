package main

import (
	"bytes"
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// TestDemo runs the demo command in-process on a fresh SQLite file, as
// `make run` does, and checks its report. It sets the environment, so it
// does not run in parallel.
func TestDemo(t *testing.T) {
	dbPath := filepath.Join(t.TempDir(), "data", "demo.db")
	for env, v := range map[string]string{
		app.EnvTransport:    "",
		app.EnvDatabaseURL:  dbPath,
		app.EnvTransportURL: "",
		app.EnvTablePrefix:  "",
		app.EnvConfig:       "",
		app.EnvAutoMigrate:  "",
		app.EnvHTTPAddr:     "127.0.0.1:0",
	} {
		t.Setenv(env, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var out bytes.Buffer
	cmd := demoCommand()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{})
	require.NoError(t, cmd.ExecuteContext(ctx))

	report := out.String()
	t.Log(report)
	for _, want := range []string{
		`processed\s+3\b`,
		`duplicate\s+1\b`,
		`dead-lettered\s+1\b`,
		`reminders scheduled by these events: 3\b`,
		`dead letter #\d+: event poison-\d+, code invalid_payload,`,
		`demo done\.`,
	} {
		require.Regexp(t, want, report)
	}
}
