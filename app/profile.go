package app

import (
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/pprof"

	"go.uber.org/fx"
)

// profileCPU starts a CPU profile of the process into cfg.CPUProfile, when
// set, and stops it when the application stops. It is invoked before
// anything opens (the database, the transport), so the profile covers the
// start, and its stop hook, appended first, runs last. A file that cannot
// be created, that is not a regular file, or that holds something other
// than a CPU profile (see createProfile), or a profile already running in
// the process, fails the build, naming the setting; a build that fails
// later stops the profile with the hooks it undoes.
func profileCPU(lc fx.Lifecycle, cfg Config) error {
	if cfg.CPUProfile == "" {
		return nil
	}
	f, err := createProfile(cfg.CPUProfile)
	if err != nil {
		return fmt.Errorf("%s: %w", EnvCPUProfile, err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		return fmt.Errorf("%s %s: %w", EnvCPUProfile, cfg.CPUProfile, errors.Join(err, f.Close()))
	}
	lc.Append(fx.StopHook(func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("%s %s: %w", EnvCPUProfile, cfg.CPUProfile, err)
		}
		return nil
	}))
	return nil
}

// gzipMagic are the first bytes of a gzip stream, as every CPU profile
// that runtime/pprof writes is.
const gzipMagic = "\x1f\x8b"

// createProfile creates the file at path for a CPU profile, or empties
// it when it is one already: a regular file that is empty or begins as
// gzip does, so that a service run again with the same setting writes
// its new profile there. Any other file is left as it is and refused: the
// setting pointed at the database once, and the profile overwrote it. A
// path that is not a regular file (a FIFO, which would block, a
// directory, a device) is refused before it is opened.
func createProfile(path string) (*os.File, error) {
	if info, err := os.Stat(path); err == nil && !info.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is %s, not a regular file: want a file for the profile", path, fileKind(info.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o666)
	if err != nil {
		return nil, err
	}
	if err := overwritableProfile(f); err != nil {
		return nil, errors.Join(err, f.Close())
	}
	if err := f.Truncate(0); err != nil {
		return nil, errors.Join(fmt.Errorf("empty %s: %w", path, err), f.Close())
	}
	return f, nil
}

// overwritableProfile returns an error unless f, just opened, is a
// regular file that is empty or holds a CPU profile (it begins with
// gzipMagic).
func overwritableProfile(f *os.File) error {
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if !info.Mode().IsRegular() {
		return fmt.Errorf("%s is %s, not a regular file: want a file for the profile", f.Name(), fileKind(info.Mode()))
	}
	if info.Size() == 0 {
		return nil
	}
	head := make([]byte, len(gzipMagic))
	if _, err := f.ReadAt(head, 0); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read %s: %w", f.Name(), err)
	}
	if string(head) != gzipMagic {
		return fmt.Errorf("%s exists and is not a CPU profile (those are gzip files, which begin with 0x1f 0x8b): refusing to overwrite it; name a new file, or remove this one", f.Name())
	}
	return nil
}
