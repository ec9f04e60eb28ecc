package bench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Process is a consumer running as a process of its own: the example
// service or a child of this program. It serves /readyz and /metrics (with
// the Go runtime's metrics) on Addr.
type Process struct {
	name    string
	cmd     *exec.Cmd
	addr    string
	profile string // where the process writes its CPU profile; empty: none
	stderr  *tailBuffer
	child   bool // serves /begin
	// peers are the processes started with this one, consuming beside it
	// (Env.startServices): Exited, Stop, Mallocs and PeakRSS take them in.
	peers []*Process

	// started is when the process was started: a drain's start-up runs
	// from it to the first effect.
	started time.Time

	client  *http.Client  // no keep-alive: nothing lingers once it stopped
	done    chan struct{} // closed once the process exited
	waitErr error
	stopped bool
}

// Addr is the address of the process's HTTP server.
func (p *Process) Addr() string { return p.addr }

// Pid is the process's id.
func (p *Process) Pid() int { return p.cmd.Process.Pid }

// Started is when the process was started.
func (p *Process) Started() time.Time { return p.started }

// ProfilePath is where the process writes its CPU profile when it stops;
// empty when it writes none.
func (p *Process) ProfilePath() string { return p.profile }

// startProcess starts cmd, which serves /readyz on addr, and returns once
// /readyz answers 200; an exit before that is an error that quotes the
// end of its standard error.
func startProcess(ctx context.Context, name string, cmd *exec.Cmd, addr, profile string, timeout time.Duration) (*Process, error) {
	p := &Process{
		name: name, cmd: cmd, addr: addr, profile: profile, stderr: &tailBuffer{max: 8 << 10}, done: make(chan struct{}),
		client: &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}},
	}
	cmd.Stdout = p.stderr
	cmd.Stderr = p.stderr
	p.started = time.Now()
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	if err := p.waitReady(ctx, timeout); err != nil {
		_ = p.kill()
		return nil, err
	}
	return p, nil
}

func (p *Process) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("%s: readiness request: %w", p.name, err)
		}
		if resp, err := p.client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%w): %s", p.name, p.waitErr, p.stderr.String())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready on %s: %w: %s", p.name, p.addr, ctx.Err(), p.stderr.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Begin tells a child to begin its work (see ChildEnv.WaitBegin); for
// the example service, which consumes once ready, it does nothing.
func (p *Process) Begin(ctx context.Context) error {
	if !p.child {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.addr+"/begin", nil)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", p.name, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return fmt.Errorf("%s: begin: %w", p.name, err)
	}
	_ = resp.Body.Close()
	return nil
}

// Exited reports an error when the process has exited, saying how.
func (p *Process) Exited() error {
	for _, q := range p.peers {
		if err := q.Exited(); err != nil {
			return err
		}
	}
	select {
	case <-p.done:
		return fmt.Errorf("%s exited (%w): %s", p.name, p.waitErr, p.stderr.String())
	default:
		return nil
	}
}

// Mallocs returns the process's heap allocations so far (the Go
// runtime's go_memstats_mallocs_total on /metrics).
func (p *Process) Mallocs(ctx context.Context) (float64, error) {
	n, err := p.Metric(ctx, "go_memstats_mallocs_total")
	for _, q := range p.peers {
		if err != nil {
			break
		}
		var m float64
		m, err = q.Mallocs(ctx)
		n += m
	}
	return n, err
}

// metricValue returns the value of the unlabelled sample name in a
// Prometheus text exposition.
func metricValue(r io.Reader, name string) (float64, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		rest, ok := strings.CutPrefix(sc.Text(), name+" ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			return 0, fmt.Errorf("sample %s: %w", name, err)
		}
		return v, nil
	}
	if err := sc.Err(); err != nil {
		return 0, fmt.Errorf("read: %w", err)
	}
	return 0, fmt.Errorf("no sample %s", name)
}

// PeakRSS returns the process's peak resident set size in bytes: VmHWM
// in /proc/<pid>/status while it runs, the kernel's maxrss once it
// exited.
func (p *Process) PeakRSS() (int64, error) {
	var peak int64
	for _, q := range p.peers {
		rss, err := q.PeakRSS()
		if err != nil {
			return 0, err
		}
		peak = max(peak, rss)
	}
	rss, err := p.peakRSS()
	return max(peak, rss), err
}

// peakRSS is PeakRSS of the process alone.
func (p *Process) peakRSS() (int64, error) {
	select {
	case <-p.done:
		if ru, ok := p.cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
			return ru.Maxrss << 10, nil
		}
		return 0, fmt.Errorf("%s: no resource usage", p.name)
	default:
	}
	return vmHWM(p.Pid())
}

func vmHWM(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("peak RSS: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		rest, ok := strings.CutPrefix(line, "VmHWM:")
		if !ok {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("peak RSS: VmHWM: %w", err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("peak RSS: no VmHWM in /proc/%d/status", pid)
}

// Stop sends SIGTERM and waits for the process to exit, killing it after
// timeout. An exit other than a clean one is an error quoting the end of
// its output. Stopping twice is a no-op.
func (p *Process) Stop(timeout time.Duration) error {
	if p.stopped {
		return nil
	}
	var errs []error
	for _, q := range p.peers {
		errs = append(errs, q.Stop(timeout))
	}
	if err := errors.Join(errs...); err != nil {
		_ = p.stop(timeout)
		return err
	}
	return p.stop(timeout)
}

// stop is Stop of the process alone.
func (p *Process) stop(timeout time.Duration) error {
	p.stopped = true
	select {
	case <-p.done:
	default:
		if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
			return fmt.Errorf("stop %s: %w", p.name, err)
		}
		select {
		case <-p.done:
		case <-time.After(timeout):
			_ = p.cmd.Process.Kill()
			<-p.done
			return fmt.Errorf("%s did not stop within %s: killed: %s", p.name, timeout, p.stderr.String())
		}
	}
	if p.waitErr != nil {
		return fmt.Errorf("%s: %w: %s", p.name, p.waitErr, p.stderr.String())
	}
	return nil
}

// kill ends the process at once and waits for it.
func (p *Process) kill() error {
	p.stopped = true
	_ = p.cmd.Process.Kill()
	<-p.done
	return nil
}

// freeAddr returns a loopback address with a port free at the time of
// the call.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		return "", fmt.Errorf("find a free port: %w", err)
	}
	return addr, nil
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf bytes.Buffer
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf.Write(b)
	if over := t.buf.Len() - t.max; over > 0 {
		t.buf.Next(over)
	}
	return len(b), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.TrimSpace(t.buf.String())
}

// cleanEnviron returns the environment without the framework's and the
// harness's own variables, so that a process sees only what its run sets.
func cleanEnviron() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "EFFECTIVELY_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

func withVars(env []string, vars map[string]string) []string {
	for k, v := range vars {
		env = append(env, k+"="+v)
	}
	return env
}
