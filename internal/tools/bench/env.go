package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver

	"github.com/effectively-once/effectively/internal/pgschema"
)

// Timeouts of the processes a run starts.
const (
	startTimeout = 2 * time.Minute
	stopTimeout  = time.Minute
)

// ServicePackage is the example service the scenarios run, built with go
// build once per Execute (see Options.ServiceBinary).
const ServicePackage = "github.com/effectively-once/effectively/examples/notifications"

// Env is what a run gets from the harness: the options, a folder of its
// own, the servers, and the means to start the example service and
// children. What a run creates through it is removed after the run.
type Env struct {
	Options
	// Scenario is the name of the scenario the run belongs to.
	Scenario string
	// Dir is a folder of the run's own, removed after it.
	Dir string
	// ID is the run's own: the ids of the events it feeds start with it
	// (see EffectTable.Prefix).
	ID string

	shared   *shared
	cleanups []func(context.Context) error
}

// shared is what the runs of one Execute share: the example service's binary.
type shared struct {
	dir string

	once    sync.Once
	service string
	err     error

	sweeps sweeps // the pre-sweeps done (see preSweep)
}

// Logf writes a progress line.
func (e *Env) Logf(format string, args ...any) {
	fmt.Fprintf(e.Log, "    "+format+"\n", args...)
}

// Cleanup registers f to run after the run, the last registered first.
func (e *Env) Cleanup(f func(context.Context) error) {
	e.cleanups = append(e.cleanups, f)
}

func (e *Env) cleanup() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var errs []error
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		errs = append(errs, e.cleanups[i](ctx))
	}
	e.cleanups = nil
	return errors.Join(errs...)
}

// Backlog returns the run's backlog: Events messages of which Duplicates
// repeat an earlier event, and the number of distinct events.
func (e *Env) Backlog() ([]Message, int) {
	return Backlog(e.ID+"-b", e.Events, e.Duplicates)
}

// PostgresSchema creates a schema of the run's own on the PostgreSQL
// server, dropped after the run, and returns a URL whose connections use
// it (search_path).
func (e *Env) PostgresSchema(ctx context.Context) (string, error) {
	if e.PostgresURL == "" {
		return "", errors.New("no PostgreSQL server (EFFECTIVELY_TEST_POSTGRES_URL)")
	}
	s, err := pgschema.Create(ctx, e.PostgresURL, "bench_")
	if err != nil {
		return "", err
	}
	e.Cleanup(s.Drop)
	return s.URL, nil
}

// ServiceBinary returns the path of the example service's binary:
// Options.ServiceBinary, or else the one BuildService builds on first use
// in the folder of the Execute.
func (e *Env) ServiceBinary(ctx context.Context) (string, error) {
	if e.Options.ServiceBinary != "" {
		return e.Options.ServiceBinary, nil
	}
	s := e.shared
	s.once.Do(func() {
		s.service, s.err = BuildService(ctx, s.dir)
	})
	return s.service, s.err
}

// BuildService builds the example service (ServicePackage) with go build
// into the folder dir and returns the binary's path; with -race when this
// program has the race detector, so that the build reuses what the test
// build compiled.
func BuildService(ctx context.Context, dir string) (string, error) {
	out := filepath.Join(dir, "notifications")
	args := []string{"build", "-o", out}
	if raceEnabled {
		args = append(args, "-race")
	}
	cmd := exec.CommandContext(ctx, "go", append(args, ServicePackage)...)
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w: %s", ServicePackage, err, strings.TrimSpace(string(msg)))
	}
	return out, nil
}

// Service runs the example service's command line with args (migrate,
// ...) and vars, and waits for it to finish.
func (e *Env) Service(ctx context.Context, vars map[string]string, args ...string) error {
	bin, err := e.ServiceBinary(ctx)
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = withVars(cleanEnviron(), vars)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("notifications %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// StartService starts the example service (serve) with the framework's
// variables vars (EFFECTIVELY_TRANSPORT, ...; EFFECTIVELY_HTTP_ADDR is
// the harness's) and returns once it is ready. Outside a smoke run it
// writes a CPU profile (EFFECTIVELY_CPU_PROFILE), unless vars set that
// variable empty: the profile's table of stacks grows with its length,
// which a run measuring memory must not count. It is stopped after the
// run if the run did not stop it.
func (e *Env) StartService(ctx context.Context, vars map[string]string) (*Process, error) {
	bin, err := e.ServiceBinary(ctx)
	if err != nil {
		return nil, err
	}
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	all := map[string]string{"EFFECTIVELY_HTTP_ADDR": addr}
	var profile string
	if !e.Smoke {
		profile = filepath.Join(e.Dir, "service.pprof")
		all["EFFECTIVELY_CPU_PROFILE"] = profile
	}
	for k, v := range vars {
		all[k] = v
	}
	if v, ok := vars["EFFECTIVELY_CPU_PROFILE"]; ok && v == "" {
		profile = ""
	}
	cmd := exec.Command(bin, "serve")
	cmd.Env = withVars(cleanEnviron(), all)
	p, err := startProcess(ctx, "notifications serve", cmd, addr, profile, startTimeout)
	if err != nil {
		return nil, err
	}
	e.Cleanup(func(context.Context) error { return p.Stop(stopTimeout) })
	return p, nil
}

// StartChild starts the scenario's child name (see Child) with vars and
// returns once it is ready. Outside a smoke run it writes a CPU profile.
// It is stopped after the run if the run did not stop it.
func (e *Env) StartChild(ctx context.Context, name string, vars map[string]string) (*Process, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	all := map[string]string{EnvChild: e.Scenario + "/" + name, EnvChildAddr: addr}
	var profile string
	if !e.Smoke {
		profile = uniquePath(filepath.Join(e.Dir, name+".pprof"))
		all[EnvChildProfile] = profile
	}
	for k, v := range vars {
		all[k] = v
	}
	cmd := exec.Command(e.Self[0], e.Self[1:]...)
	cmd.Env = withVars(cleanEnviron(), all)
	p, err := startProcess(ctx, "child "+name, cmd, addr, profile, startTimeout)
	if err != nil {
		return nil, err
	}
	p.child = true
	e.Cleanup(func(context.Context) error { return p.Stop(stopTimeout) })
	return p, nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// mkdirTemp makes a temporary folder under dir.
func mkdirTemp(dir, pattern string) (string, error) {
	d, err := os.MkdirTemp(dir, pattern)
	if err != nil {
		return "", fmt.Errorf("temporary folder: %w", err)
	}
	return d, nil
}

// uniquePath returns path, or path with -2, -3... before its extension
// when a file by that name exists: a run may start a child twice.
func uniquePath(path string) string {
	ext := filepath.Ext(path)
	base := strings.TrimSuffix(path, ext)
	for i := 2; ; i++ {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return path
		}
		path = fmt.Sprintf("%s-%d%s", base, i, ext)
	}
}
