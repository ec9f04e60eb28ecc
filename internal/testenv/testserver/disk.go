package testserver

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/testenv"
)

// Disk is a small filesystem of a test's own: a tmpfs mounted with a
// size, for the tests of a full disk. Fill takes its space; Grow gives
// it more by remounting, as an operator who extends a volume does.
type Disk struct {
	// Dir is where it is mounted, owned by root (chown it for a server's
	// user).
	Dir    string
	filler string
}

// MountDisk mounts a tmpfs of size bytes (rounded up to pages) in a new
// folder, and unmounts it when the test ends. It needs root and the
// capability to mount: without them the test is skipped (it fails under
// CI=true, see testenv.Missing).
func MountDisk(t *testing.T, size int64) *Disk {
	t.Helper()
	dir, err := os.MkdirTemp("", "effectively-disk-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.Remove(dir) }) // once unmounted
	return mountDisk(t, dir, size, "0755")
}

// mountDisk mounts a tmpfs of size bytes on dir, with mode, and unmounts
// it when the test ends.
func mountDisk(t *testing.T, dir string, size int64, mode string) *Disk {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "mounting a small filesystem needs root")
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%d,mode=%s", size, mode), "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs (the capability to mount is needed): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
	return &Disk{Dir: dir, filler: filepath.Join(dir, ".filler")}
}

// Fill writes a file that takes the disk's free space until a write
// fails with ENOSPC; it returns how many bytes it wrote. Another Fill
// takes what was freed since.
func (d *Disk) Fill(t *testing.T) int64 {
	t.Helper()
	f, err := os.OpenFile(d.filler, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	require.NoError(t, err)
	defer f.Close()
	buf := make([]byte, 4096)
	var n int64
	for {
		k, err := f.Write(buf)
		n += int64(k)
		if errors.Is(err, syscall.ENOSPC) {
			return n
		}
		require.NoError(t, err)
	}
}

// Free returns the disk's free bytes.
func (d *Disk) Free(t *testing.T) int64 {
	t.Helper()
	var st syscall.Statfs_t
	require.NoError(t, syscall.Statfs(d.Dir, &st))
	return int64(st.Bavail) * st.Bsize
}

// Grow remounts the disk with size bytes, its files kept.
func (d *Disk) Grow(t *testing.T, size int64) {
	t.Helper()
	out, err := exec.Command("mount", "-o", fmt.Sprintf("remount,size=%d", size), d.Dir).CombinedOutput()
	require.NoError(t, err, "remount %s: %s", d.Dir, out)
}
