package soak

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/effectively-once/effectively/internal/testenv"
)

// service is the soak's service binary with the environment of one run.
type service struct {
	bin  string
	dir  string
	vars []string
}

// proc is one running process of the service.
type proc struct {
	name string
	addr string
	cmd  *exec.Cmd
	done chan struct{}
	err  error
	log  string
}

// start starts the service as name, with extra variables, and waits
// until it serves /readyz with 200 or timeout passes.
func (s *service) start(ctx context.Context, name string, timeout time.Duration, extra ...string) (*proc, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &proc{name: name, addr: fmt.Sprintf("127.0.0.1:%d", port), done: make(chan struct{}), log: filepath.Join(s.dir, name+".log")}
	out, err := os.OpenFile(p.log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, fmt.Errorf("%s: log: %w", name, err)
	}
	p.cmd = exec.Command(s.bin, "serve")
	p.cmd.Env = append(append(append(os.Environ(), s.vars...), extra...), "EFFECTIVELY_HTTP_ADDR="+p.addr)
	p.cmd.Stdout, p.cmd.Stderr = out, out
	waited, err := testenv.StartChild(p.cmd) // killed with the soak, if it dies first
	if err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	go func() {
		p.err = <-waited
		_ = out.Close()
		close(p.done)
	}()
	if err := p.waitReady(ctx, timeout); err != nil {
		p.kill()
		return nil, err
	}
	return p, nil
}

func (p *proc) waitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	client := &http.Client{Timeout: time.Second}
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/readyz", nil)
		if err != nil {
			return fmt.Errorf("%s: readiness: %w", p.name, err)
		}
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			if p.err == nil {
				return fmt.Errorf("%s exited before it was ready: see %s", p.name, p.log)
			}
			return fmt.Errorf("%s exited before it was ready (%w): see %s", p.name, p.err, p.log)
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w: see %s", p.name, ctx.Err(), p.log)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// kill sends SIGKILL and waits for the process to end.
func (p *proc) kill() {
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// stop sends SIGTERM and waits up to timeout, then kills.
func (p *proc) stop(timeout time.Duration) error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s stopped with %w: see %s", p.name, p.err, p.log)
		}
		return nil
	case <-time.After(timeout):
		p.kill()
		return fmt.Errorf("%s did not stop within %s: see %s", p.name, timeout, p.log)
	}
}

// command runs the service's command line (migrate, dead-letters ...)
// and returns its output.
func (s *service) command(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, s.bin, args...)
	cmd.Env = append(os.Environ(), s.vars...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("soakservice %s: %w: %s", args[0], err, out)
	}
	return string(out), nil
}

// ownFigures are the metrics that a consumer process keeps of its own
// (not read from the database): what it holds in memory now.
var ownFigures = []string{
	"effectively_consumer_waiting_messages",
	"effectively_consumer_paused_messages",
	"effectively_consumer_failing_messages",
	"effectively_consumer_oldest_failing_seconds",
}

// figures returns the process's own figures (ownFigures) from its
// /metrics, one line each, or why it could not read them.
func (p *proc) figures(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+"/metrics", nil)
	if err != nil {
		return err.Error()
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return err.Error()
	}
	var lines []string
	for l := range strings.Lines(string(body)) {
		for _, name := range ownFigures {
			if strings.HasPrefix(l, name) {
				lines = append(lines, strings.TrimSpace(l))
			}
		}
	}
	return strings.Join(lines, "; ")
}
