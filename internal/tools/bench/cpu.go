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
	_, proc, ok := readProcStat(pid)
	if !ok {
		return s, fmt.Errorf("cpu: cannot read /proc/%d/stat", pid)
	}
	s.proc = proc
	return s, nil
}

// CPU is how busy the machine and the consumer were during a drain.
type CPU struct {
	// Machine is the share of all the machine's cores that was busy
	// (0..1), whoever used it: the consumer, the servers, the rest.
	Machine float64
	// Consumer is how many cores the consumer's process used on average.
	Consumer float64
	// Groups is how many cores each group of processes used on average
	// (groupConsumer, groupRabbitMQ, groupPostgres, groupBenchmark: see
	// procWatch); nil when not read.
	Groups map[string]float64
	// Seconds is the time from a to b of cpuBetween.
	Seconds float64
	// Messages is how many messages the consumer handled meanwhile.
	Messages int
}

// cpuBetween returns the CPU use from a to b, taken at and from ends
// seconds apart, and, with groups, the clock ticks that a procWatch
// counted meanwhile.
func cpuBetween(a, b cpuSample, seconds float64, groups map[string]uint64) CPU {
	total := float64(b.total - a.total)
	if total <= 0 {
		return CPU{}
	}
	perCore := total / float64(runtime.NumCPU())
	c := CPU{Machine: float64(b.busy-a.busy) / total, Consumer: float64(b.proc-a.proc) / perCore, Seconds: seconds}
	if groups != nil {
		c.Groups = make(map[string]float64, len(groups))
		for g, n := range groups {
			c.Groups[g] = float64(n) / perCore
		}
	}
	return c
}

// PerMessage returns the CPU time of each group and of the whole machine
// during the drain, in µs a message handled; ok is false when the groups
// were not read.
func (c CPU) PerMessage() (groups map[string]float64, machine float64, ok bool) {
	if c.Groups == nil || c.Messages <= 0 || c.Seconds <= 0 {
		return nil, 0, false
	}
	us := func(cores float64) float64 { return cores * c.Seconds / float64(c.Messages) * 1e6 }
	groups = make(map[string]float64, len(c.Groups))
	for g, cores := range c.Groups {
		groups[g] = us(cores)
	}
	return groups, us(c.Machine * float64(runtime.NumCPU())), true
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
