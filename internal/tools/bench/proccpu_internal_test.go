package bench

import (
	"math"
	"os"
	"runtime"
	"testing"
	"time"
)

// TestProcWatch: a watch counts the CPU time the consumer's process uses
// while it runs (here this process, busy until it used 300 ms more, over
// several of the watch's passes), as /proc reads it at both ends.
func TestProcWatch(t *testing.T) {
	_, before, ok := readProcStat(os.Getpid())
	if !ok {
		t.Fatal("cannot read this process's /proc/PID/stat")
	}
	w := watchProcesses(os.Getpid())
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, now, _ := readProcStat(os.Getpid())
		if now >= before+30 || time.Now().After(deadline) { // clock ticks of 10 ms
			break
		}
	}
	ticks := w.finish()
	_, after, _ := readProcStat(os.Getpid())
	if got := ticks[groupConsumer]; got < 25 || got > after-before {
		t.Fatalf("the watch counted %d ticks of the consumer's CPU, /proc %d (all groups: %v)", got, after-before, ticks)
	}
	if _, ok := ticks[groupBenchmark]; ok {
		t.Fatalf("this process counted as the benchmark's too: %v", ticks)
	}
}

// TestPerMessage: half a core for two seconds over 1,000 messages is
// 1,000 µs a message.
func TestPerMessage(t *testing.T) {
	c := CPU{Machine: 0.5, Groups: map[string]float64{groupConsumer: 0.5, groupRabbitMQ: 0.25}, Seconds: 2, Messages: 1000}
	groups, machine, ok := c.PerMessage()
	if !ok {
		t.Fatal("no figures")
	}
	if math.Abs(groups[groupConsumer]-1000) > 1e-6 || math.Abs(groups[groupRabbitMQ]-500) > 1e-6 {
		t.Fatalf("groups: %v", groups)
	}
	if want := 0.5 * float64(runtime.NumCPU()) * 2 / 1000 * 1e6; math.Abs(machine-want) > 1e-6 {
		t.Fatalf("machine: %v, want %v", machine, want)
	}
	if _, _, ok := (CPU{Machine: 0.5}).PerMessage(); ok {
		t.Fatal("figures without groups read")
	}
}

// TestWriteMarkdownCPUGroups: the report gives each run's CPU a message
// by group in a table whose columns are the groups that took 2% of a
// run's at least, with the rest of the machine's and the whole.
func TestWriteMarkdownCPUGroups(t *testing.T) {
	// 1,000 messages in 2 seconds: a core's worth is 2,000 µs a message.
	cpu := func(machine float64, groups map[string]float64) CPU {
		return CPU{Machine: machine / float64(runtime.NumCPU()), Groups: groups, Seconds: 2, Messages: 1000}
	}
	r := &Report{Scenarios: []ScenarioReport{{Title: "Relay", Runs: []RunReport{
		{Name: "relay", Result: Result{CPU: cpu(1, map[string]float64{groupConsumer: 0.25, groupPostgres: 0.5, groupRabbitMQ: 0.005})}},
		{Name: "baseline", Result: Result{CPU: cpu(0.5, map[string]float64{groupConsumer: 0.25, groupBenchmark: 0.125})}},
	}}}}
	requireMarkdownLines(t, r,
		"| run | consumer | PostgreSQL | benchmark | rest | all |",
		"| relay | 500 | 1000 | 0 | 500 | 2000 |",
		"| baseline | 500 | 0 | 250 | 250 | 1000 |",
	)
}
