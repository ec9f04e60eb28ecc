package bench

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// cpuSample is a reading of the machine's and a process's CPU time, in
// clock ticks.
type cpuSample struct {
	busy, total uint64 // the machine's, over all cores
	proc        uint64 // the process's user and system time
}

// sampleCPU reads /proc/stat and /proc/<pid>/stat.
func sampleCPU(pid int) (cpuSample, error) {
	var s cpuSample
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return s, fmt.Errorf("cpu: %w", err)
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return s, fmt.Errorf("cpu: unexpected /proc/stat line %q", line)
	}
	// user nice system idle iowait irq softirq steal (guest is in user).
	for i, v := range f[1:9] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("cpu: /proc/stat: %w", err)
		}
		s.total += n
		if i != 3 && i != 4 {
			s.busy += n
		}
	}
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("cpu: %w", err)
	}
	// The fields after the command, which is in parentheses: utime and
	// stime are the 12th and 13th.
	i := strings.LastIndexByte(string(b), ')')
	g := strings.Fields(string(b)[i+1:])
	if len(g) < 13 {
		return s, fmt.Errorf("cpu: short /proc/%d/stat", pid)
	}
	for _, v := range g[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return s, fmt.Errorf("cpu: /proc/%d/stat: %w", pid, err)
		}
		s.proc += n
	}
	return s, nil
}

// CPU is how busy the machine and the consumer were during a drain.
type CPU struct {
	// Machine is the share of all the machine's cores that was busy
	// (0..1), whoever used it: the consumer, the servers, the rest.
	Machine float64
	// Consumer is how many cores the consumer's process used on average.
	Consumer float64
}

// cpuBetween returns the CPU use from a to b.
func cpuBetween(a, b cpuSample) CPU {
	total := float64(b.total - a.total)
	if total <= 0 {
		return CPU{}
	}
	perCore := total / float64(runtime.NumCPU())
	return CPU{Machine: float64(b.busy-a.busy) / total, Consumer: float64(b.proc-a.proc) / perCore}
}

// bound says in a sentence what the figures of a drain suggest bounds it.
func (c CPU) bound(cores int) string {
	if c.Machine == 0 {
		return ""
	}
	rest := c.Machine*float64(cores) - c.Consumer
	s := fmt.Sprintf("during the drain the machine's %d cores were %.0f%% busy: the consumer used %.2f cores, the servers and the rest %.2f", cores, c.Machine*100, c.Consumer, max(0, rest))
	switch {
	case c.Machine >= 0.9:
		return s + ": the machine's CPU bounds it."
	case c.Consumer >= 0.85:
		return s + ": about one core's worth of serialised work in the consumer (one writer at a time, one message at a time) bounds it while the machine has CPU to spare."
	default:
		return s + ": neither the machine's CPU nor one core bounds it; the time goes in waits (round trips, commits, polls)."
	}
}
