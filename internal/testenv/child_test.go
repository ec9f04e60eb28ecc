package testenv_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// envChildParent makes the test binary run as the parent of
// TestStartChildDiesWithParent: it starts a child and waits to be killed.
const envChildParent = "EFFECTIVELY_TEST_CHILD_PARENT"

// childWait bounds the waits of these tests; a healthy run needs
// milliseconds.
const childWait = 30 * time.Second

// TestStartChildDiesWithParent kills, with SIGKILL, a process that
// started a child with StartChild: the child dies too.
func TestStartChildDiesWithParent(t *testing.T) {
	if os.Getenv(envChildParent) == "1" {
		runChildParent()
		return
	}
	t.Parallel()
	parent := exec.Command(os.Args[0], "-test.run=^TestStartChildDiesWithParent$", "-test.count=1")
	parent.Env = append(os.Environ(), envChildParent+"=1")
	stdout, err := parent.StdoutPipe()
	require.NoError(t, err)
	waited, err := testenv.StartChild(parent)
	require.NoError(t, err)
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the parent prints its child's pid")
	child, err := strconv.Atoi(strings.TrimSpace(line))
	require.NoError(t, err, "the parent prints its child's pid, got %q", line)
	t.Cleanup(func() { _ = syscall.Kill(child, syscall.SIGKILL) }) // when the test fails

	require.NoError(t, parent.Process.Kill())
	<-waited
	deadline := time.Now().Add(childWait)
	for alive(child) {
		require.True(t, time.Now().Before(deadline), "child %d still runs %s after its parent was killed", child, childWait)
		time.Sleep(10 * time.Millisecond)
	}
}

// runChildParent starts a child that would run for minutes, prints its
// pid and waits to be killed.
func runChildParent() {
	cmd := exec.Command("sleep", "300")
	waited, err := testenv.StartChild(cmd)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Println(cmd.Process.Pid)
	<-waited
	os.Exit(3) // the test kills this process before its child exits
}

// alive reports whether process pid runs: it exists and is not a zombie.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: the state follows the last ')'.
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

// TestStartChildOutlivesCallerThread starts a child from a goroutine
// locked to its thread, which then exits and so ends the thread: the
// child, whose parent-death signal follows the thread that forked it,
// still runs.
func TestStartChildOutlivesCallerThread(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("cat")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)

	type result struct {
		tid    int
		waited <-chan error
		err    error
	}
	started := make(chan result, 1)
	var r result
	for range 10 {
		go func() {
			runtime.LockOSThread() // never unlocked: the thread ends with this goroutine
			if syscall.Gettid() == syscall.Getpid() {
				// The process's main thread, which Go parks instead of
				// ending it when a goroutine locked to it exits: try
				// from another thread.
				started <- result{tid: 0}
				return
			}
			waited, err := testenv.StartChild(cmd)
			started <- result{tid: syscall.Gettid(), waited: waited, err: err}
		}()
		if r = <-started; r.tid != 0 {
			break
		}
	}
	require.NotZero(t, r.tid, "every goroutine ran on the main thread")
	require.NoError(t, r.err)
	t.Cleanup(func() {
		_ = stdin.Close()
		<-r.waited
	})
	task := filepath.Join("/proc/self/task", strconv.Itoa(r.tid))
	deadline := time.Now().Add(childWait)
	for {
		if _, err := os.Stat(task); os.IsNotExist(err) {
			break // the thread ended: a signal it sends on its death is sent
		}
		require.True(t, time.Now().Before(deadline), "thread %d still runs %s after its goroutine ended", r.tid, childWait)
		time.Sleep(10 * time.Millisecond)
	}

	_, err = io.WriteString(stdin, "ping\n")
	require.NoError(t, err, "the child reads")
	line, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the child answers")
	require.Equal(t, "ping\n", line)
}
