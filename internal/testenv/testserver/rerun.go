package testserver

import (
	"context"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// RerunWithoutRace runs the test named name of the current package (the
// test binary's folder) in a child `go test` built without the race
// detector, and fails with its output when it fails. Call it from a test
// when RaceEnabled, and return.
func RerunWithoutRace(t *testing.T, name string) {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		testenv.Missing(t, "no go command to run the child test with")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, gobin, "test", "-count=1", "-run", "^"+name+"$", "-v", ".")
	cmd.Env = os.Environ()
	out, err := cmd.CombinedOutput()
	t.Logf("child go test without -race:\n%s", out)
	require.NoError(t, err, "the child run failed")
	require.Contains(t, string(out), "--- PASS: "+name, "the child run ran the test")
}
