package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// The variables that tell this program it runs as a child, and how.
const (
	// EnvChild names the child to run ("<scenario>/<child>").
	EnvChild = "EFFECTIVELY_BENCH_CHILD"
	// EnvChildAddr is where the child serves /readyz and /metrics.
	EnvChildAddr = "EFFECTIVELY_BENCH_HTTP_ADDR"
	// EnvChildProfile, when set, is where the child writes its CPU
	// profile, from its start to its stop.
	EnvChildProfile = "EFFECTIVELY_BENCH_CPU_PROFILE"
)

// A Child is a program a scenario runs as a process of its own, so that
// its memory and allocations are measured apart from the harness's: this
// program (the bench command, or the test binary) started again with
// EnvChild set. A baseline consumer is one.
type Child struct {
	// Name is unique within the scenario.
	Name string
	// Main runs the child until ctx ends (SIGTERM), calling Ready once it
	// consumes. Its settings come from the variables the run passed to
	// Env.StartChild (ChildEnv.Getenv).
	Main func(ctx context.Context, c *ChildEnv) error
}

// ChildEnv is what a child's Main gets from the harness.
type ChildEnv struct {
	ready atomic.Bool
	begin chan struct{}
	once  sync.Once
}

// Ready says that the child consumes: /readyz answers 200 from now on.
func (c *ChildEnv) Ready() { c.ready.Store(true) }

// WaitBegin waits until the run says to begin (Process.Begin), once it
// has read the child's allocations so far: a child that starts its work
// by itself (a producer, a batch) waits for it, so that its allocations
// per message count only the work.
func (c *ChildEnv) WaitBegin(ctx context.Context) error {
	select {
	case <-c.begin:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Getenv returns a variable the run passed to the child.
func (c *ChildEnv) Getenv(key string) string { return os.Getenv(key) }

// IsChild reports whether this process was started as a child (EnvChild
// is set): its main must then call ChildMain and exit with its code.
func IsChild() bool { return os.Getenv(EnvChild) != "" }

// ChildMain runs the child that EnvChild names, among the children of
// scenarios, until SIGTERM or SIGINT, and returns the exit code. It serves
// /readyz and /metrics (the Go runtime's metrics, as the example service
// does) on EnvChildAddr, and writes a CPU profile to EnvChildProfile when
// set.
func ChildMain(scenarios []Scenario) int {
	name := os.Getenv(EnvChild)
	if err := runChild(name, scenarios); err != nil {
		fmt.Fprintf(os.Stderr, "bench child %s: %v\n", name, err)
		return 1
	}
	return 0
}

func runChild(name string, scenarios []Scenario) error {
	child, ok := findChild(name, scenarios)
	if !ok {
		return errors.New("no such child")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	if path := os.Getenv(EnvChildProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return fmt.Errorf("CPU profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("CPU profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}

	env := &ChildEnv{begin: make(chan struct{})}
	srv, err := serveChild(env, os.Getenv(EnvChildAddr))
	if err != nil {
		return err
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	}()
	return child.Main(ctx, env)
}

func findChild(name string, scenarios []Scenario) (Child, bool) {
	for _, s := range scenarios {
		for _, c := range s.Children {
			if s.Name+"/"+c.Name == name {
				return c, true
			}
		}
	}
	return Child{}, false
}

// serveChild serves /readyz, /metrics and /begin on addr.
func serveChild(env *ChildEnv, addr string) (*http.Server, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !env.ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	mux.HandleFunc("POST /begin", func(http.ResponseWriter, *http.Request) {
		env.once.Do(func() { close(env.begin) })
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s (%s): %w", addr, EnvChildAddr, err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	return srv, nil
}
