package bench

import (
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The groups of processes whose CPU a drain's report gives apart.
const (
	groupConsumer  = "consumer"
	groupPostgres  = "PostgreSQL"
	groupRabbitMQ  = "RabbitMQ"
	groupBenchmark = "benchmark"
)

// cpuGroups returns the groups in the order the report shows them.
func cpuGroups() []string {
	return []string{groupConsumer, groupRabbitMQ, groupPostgres, groupBenchmark}
}

// serverGroup returns the group of a process by its command name (the
// comm field of /proc/PID/stat), or "" for none: every PostgreSQL
// process (backends, WAL writer, checkpointer, autovacuum) is named
// postgres, and RabbitMQ's are the Erlang VM and its helpers.
func serverGroup(comm string) string {
	switch comm {
	case "postgres":
		return groupPostgres
	case "beam.smp", "erl_child_setup", "epmd", "inet_gethost":
		return groupRabbitMQ
	}
	return ""
}

// procWatchInterval is how often a procWatch reads the processes' CPU
// time: a process that exits during the drain (a PostgreSQL backend of a
// closed connection) loses at most this much of its time.
const procWatchInterval = 250 * time.Millisecond

// procWatch reads every process's CPU time (user and system, in
// /proc/PID/stat) along a drain and sums it by group: the consumer's
// process, PostgreSQL's and RabbitMQ's, and the benchmark's own (this
// process: the sink that counts an outbox's messages, the pollers of the
// effects' tables). On a machine whose cores the servers share with the
// consumer, it says where a message's CPU went.
type procWatch struct {
	consumer, self int
	stop, done     chan struct{}

	mu    sync.Mutex
	last  map[int]procTicks // each process's reading at the last pass
	ticks map[string]uint64 // by group, since the start
}

// procTicks is one process's reading: its group and CPU time in clock
// ticks.
type procTicks struct {
	group string
	ticks uint64
}

// watchProcesses starts a procWatch of the consumer's process pid and
// the servers; stop ends it and returns what each group used.
func watchProcesses(pid int) *procWatch {
	w := &procWatch{
		consumer: pid, self: os.Getpid(),
		stop: make(chan struct{}), done: make(chan struct{}),
		last: map[int]procTicks{}, ticks: map[string]uint64{},
	}
	w.pass(true)
	go w.run()
	return w
}

func (w *procWatch) run() {
	defer close(w.done)
	t := time.NewTicker(procWatchInterval)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.pass(false)
		}
	}
}

// pass reads every process of a group and adds what each used since
// the last pass; a process not seen before started since, and counts
// from zero, unless this is the first pass.
func (w *procWatch) pass(first bool) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	seen := make(map[int]procTicks, len(w.last))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		comm, ticks, ok := readProcStat(pid)
		if !ok {
			continue // gone meanwhile
		}
		group := serverGroup(comm)
		switch pid {
		case w.consumer:
			group = groupConsumer
		case w.self:
			group = groupBenchmark
		}
		if group == "" {
			continue
		}
		now := procTicks{group: group, ticks: ticks}
		seen[pid] = now
		if first {
			continue
		}
		before, ok := w.last[pid]
		if ok && before.group != group {
			ok = false // another process under a reused pid
		}
		if ok && ticks >= before.ticks {
			w.ticks[group] += ticks - before.ticks
		} else if !ok {
			w.ticks[group] += ticks
		}
	}
	w.last = seen
}

// readProcStat returns the command name and the user and system time,
// in clock ticks, of process pid.
func readProcStat(pid int) (comm string, ticks uint64, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return "", 0, false
	}
	s := string(b)
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return "", 0, false
	}
	// After the command: state is the 1st field, utime and stime the
	// 12th and 13th.
	f := strings.Fields(s[end+1:])
	if len(f) < 13 {
		return "", 0, false
	}
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return "", 0, false
		}
		ticks += n
	}
	return s[open+1 : end], ticks, true
}

// finish stops the watch after a last pass and returns the clock ticks
// each group used since it started.
func (w *procWatch) finish() map[string]uint64 {
	close(w.stop)
	<-w.done
	w.pass(false)
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ticks
}
