package testenv

import (
	"fmt"
	"os/exec"
	"runtime"
	"syscall"
)

// StartChild starts cmd, a subprocess of a test (a service, the test
// binary run in a mode of its own), so that the kernel kills it with
// SIGKILL when the test process dies first: a test binary killed on its
// -timeout, or by hand, leaves no service behind holding a database, a
// queue or a port. It returns a channel that receives cmd.Wait's result
// once the child exited; the caller must receive it (or let the child
// be killed and then receive it), as with cmd.Wait.
//
// The kernel sends the parent-death signal (syscall.SysProcAttr's
// Pdeathsig, PR_SET_PDEATHSIG) when the thread that forked the child
// exits, not the process (see https://go.dev/issue/27505), and a Go
// program ends a thread whenever a goroutine that locked it exits
// without unlocking it: a child started from an arbitrary goroutine
// could be killed by the end of an unrelated goroutine that later ran
// on the same thread. So StartChild forks from a goroutine of its own,
// locked to its thread, that waits for the child and exits locked once
// the child is reaped: the thread lives exactly as long as the child,
// and dies with the process.
func StartChild(cmd *exec.Cmd) (<-chan error, error) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	started := make(chan error, 1)
	waited := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the child (see above)
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		waited <- cmd.Wait()
	}()
	if err := <-started; err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	return waited, nil
}

// RunChild runs cmd as StartChild starts it and waits for it to exit,
// as cmd.Run does.
func RunChild(cmd *exec.Cmd) error {
	waited, err := StartChild(cmd)
	if err != nil {
		return err
	}
	return <-waited
}
