package faults_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// childVar names the variable that makes the test binary run one
// instance of a rig's service as a process of its own (see runChild)
// instead of the tests: its value is the instance's childSpec, in JSON.
const childVar = "EFFECTIVELY_FAULTS_INSTANCE"

// childSpec is what a child instance runs.
type childSpec struct {
	ID          string // the rig's id, which names its event types and consumers
	Instance    int    // its index among the rig's instances, for its logs
	Transport   string
	DatabaseURL string // through the rig's proxy
	AMQPURL     string // through the rig's proxy; "" on the PostgreSQL transport
}

// childStarted is the line a child instance writes to its standard
// output once its application started.
const childStarted = "started"

// runChild runs the instance of spec, a childSpec in JSON, until it
// receives SIGTERM, logging to its standard error, and returns its exit
// code.
func runChild(spec string) int {
	var cs childSpec
	if err := json.Unmarshal([]byte(spec), &cs); err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", childVar, err)
		return 2
	}
	logger := slog.New(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("instance", cs.Instance)
	svc := newService(cs.ID)
	cfg, err := svc.config(cs)
	if err != nil {
		logger.Error("faults child: configuration", "error", err)
		return 2
	}
	stopped, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	a := app.New(svc.module(cfg, logger, nil))
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.Start(ctx); err != nil {
		logger.Error("faults child: start", "error", err)
		return 1
	}
	fmt.Println(childStarted)
	<-stopped.Done()
	ctx, cancel = context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	if err := a.Stop(ctx); err != nil {
		logger.Error("faults child: stop", "error", err)
		return 1
	}
	return 0
}

// child is an instance running in a process of its own.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once the process exited
	err    error         // its exit, once exited is closed
}

// startChild starts instance i of the rig's service in a process of its
// own (the test binary, see runChild), its log lines kept with the
// rig's, and returns once the instance started. It dies with the test's
// process.
func (r *rig) startChild(i int) *instance {
	r.t.Helper()
	spec := r.spec
	spec.Instance = i
	b, err := json.Marshal(spec)
	require.NoError(r.t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childVar+"="+string(b))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	require.NoError(r.t, err)
	stderr, err := cmd.StderrPipe()
	require.NoError(r.t, err)
	require.NoError(r.t, cmd.Start())
	c := &child{cmd: cmd, exited: make(chan struct{})}
	started := make(chan struct{})
	logged := make(chan struct{})
	go func() {
		defer close(logged)
		lines := bufio.NewScanner(stderr)
		lines.Buffer(nil, 1<<20)
		for lines.Scan() {
			_, _ = r.logs.Write(append(lines.Bytes(), '\n'))
		}
	}()
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			if lines.Text() == childStarted {
				close(started)
				break
			}
		}
		_, _ = io.Copy(io.Discard, stdout)
		<-logged
		c.err = cmd.Wait()
		close(c.exited)
	}()
	in := &instance{child: c}
	r.t.Cleanup(func() { _ = c.stop(waitLimit) }) // when a check failed first
	select {
	case <-started:
	case <-c.exited:
		r.t.Fatalf("instance %d exited before it started: %v", i, c.err)
	case <-time.After(waitLimit):
		r.t.Fatalf("instance %d did not start within %s", i, waitLimit)
	}
	return in
}

// stop stops the child with SIGTERM, and kills it after limit; it
// returns an error when it did not exit cleanly.
func (c *child) stop(limit time.Duration) error {
	select {
	case <-c.exited:
		return c.err
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.exited:
		return c.err
	case <-time.After(limit):
		_ = c.cmd.Process.Kill()
		<-c.exited
		return errors.New("the instance did not stop within " + limit.String() + "; killed")
	}
}
