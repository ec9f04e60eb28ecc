package bench

import (
	"bufio"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"
)

// findings explains the figures against those measured by hand before
// the harness existed; the report carries it after its summary.
//
//go:embed findings.md
var findings string

// Report is the outcome of Execute: every run's figures, or why it failed.
type Report struct {
	Date      time.Time
	Machine   Machine
	Options   Options
	Scenarios []ScenarioReport
	// Elapsed is how long Execute took, every scenario's set-up, pre-sweep
	// and rounds.
	Elapsed time.Duration
}

// ScenarioReport is a scenario's part of the report.
type ScenarioReport struct {
	Name, Title, About string
	// Skipped says why the scenario did not run; empty when it ran.
	Skipped string
	// Once says the scenario's runs were measured once (Scenario.Once).
	Once bool
	// Rounds is how many times each of its runs was measured (see
	// Scenario.MinRounds).
	Rounds int
	// Scale is how many times Options.Events its runs drained
	// (Scenario.Scale; zero or one: once).
	Scale float64
	// Gate is the scenario's gate (Scenario.Gate); nil when none.
	Gate *Gate
	Runs []RunReport
	// Elapsed is how long the scenario took, its rounds and any pre-sweep.
	Elapsed time.Duration
}

// RunReport is a run's figures, or why it failed.
type RunReport struct {
	Name     string
	Baseline bool
	Result   Result
	Err      error
	// Rounds are the effects per second of each round the run was
	// measured in, in order, when it was measured more than once: Result
	// is the round with the median.
	Rounds []float64
}

// Err joins the failures of every run; nil when all passed.
func (r *Report) Err() error {
	return errors.Join(r.RunsErr(), r.GatesErr())
}

// RunsErr reports the runs that failed (an error, effects not exactly
// once): their figures say nothing.
func (r *Report) RunsErr() error {
	var errs []error
	for _, s := range r.Scenarios {
		for _, run := range s.Runs {
			if run.Err != nil {
				errs = append(errs, fmt.Errorf("%s / %s: %w", s.Title, run.Name, run.Err))
			}
		}
	}
	return errors.Join(errs...)
}

// GatesErr reports the gates not met: the figures stand, and the report
// shows each gate missed.
func (r *Report) GatesErr() error {
	var errs []error
	for _, s := range r.Scenarios {
		if _, err := s.gate(r.Options.Smoke); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", s.Title, err))
		}
	}
	if _, err := r.timeGate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// ratio returns the run's effects per second over its baseline's.
func (s ScenarioReport) ratio(run RunReport) float64 {
	for _, b := range s.Runs {
		if b.Baseline && b.Err == nil && b.Result.EffectsPerSecond() > 0 && run.Err == nil {
			return run.Result.EffectsPerSecond() / b.Result.EffectsPerSecond()
		}
	}
	return 0
}

// Machine describes where the report was measured.
type Machine struct {
	CPU      string
	Cores    int
	MemBytes int64
	Go       string
	OS       string
	LoadAvg  string // at the start of the run
	Postgres string // server version, when one was given
	RabbitMQ string // broker version, when one was given
}

// ReadMachine reads the machine's description from /proc and the servers.
func ReadMachine(ctx context.Context, opts Options) Machine {
	m := Machine{Cores: runtime.NumCPU(), Go: runtime.Version(), OS: runtime.GOOS + "/" + runtime.GOARCH}
	m.CPU = procField("/proc/cpuinfo", "model name", ":")
	if kb, err := strconv.ParseInt(strings.TrimSuffix(procField("/proc/meminfo", "MemTotal", ":"), " kB"), 10, 64); err == nil {
		m.MemBytes = kb << 10
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if f := strings.Fields(string(b)); len(f) >= 3 {
			m.LoadAvg = strings.Join(f[:3], " ")
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.OS += ", Linux " + strings.TrimSpace(string(b))
	}
	if opts.PostgresURL != "" {
		if db, err := sqlx.Open("pgx", opts.PostgresURL); err == nil {
			_ = db.QueryRowContext(ctx, "SHOW server_version").Scan(&m.Postgres)
			_ = db.Close()
		}
	}
	if opts.AMQPURL != "" {
		if conn, err := amqp091.Dial(opts.AMQPURL); err == nil {
			if v, ok := conn.Properties["version"].(string); ok {
				m.RabbitMQ = v
			}
			_ = conn.Close()
		}
	}
	return m
}

// procField returns the value of the first line of file that starts with
// key, after sep.
func procField(file, key, sep string) string {
	f, err := os.Open(file)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), sep)
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// columns are the figures of a run, in the order of the tables.
var columns = []string{"effects/s", "ratio", "steady/s", "start-up", "p50", "p99", "at rate", "allocs/msg", "peak RSS", "CPU: consumer", "CPU: machine", "effects"}

// WriteTable writes the figures as an aligned text table.
func (r *Report) WriteTable(w io.Writer) error {
	rows := [][]string{append([]string{"scenario / run"}, columns...)}
	for _, s := range r.Scenarios {
		if s.Skipped != "" {
			rows = append(rows, []string{s.Title + ": skipped, " + s.Skipped})
			continue
		}
		rows = append(rows, []string{s.Title})
		for _, run := range s.Runs {
			rows = append(rows, append([]string{"  " + run.Name}, r.cells(s, run)...))
			if m := run.Result.Memory; m != nil {
				rows = append(rows, []string{"    " + m.String()})
			}
			if sw := run.Result.Sweep; sw != nil {
				rows = append(rows, []string{fmt.Sprintf("    the best of a pre-sweep of %d configurations: %s", len(sw.Points), sw.BestConfig())})
			}
			if line := run.Result.CPU.perMessageLine(); line != "" {
				rows = append(rows, []string{"    " + line})
			}
		}
		lines, _ := s.gate(r.Options.Smoke)
		for _, line := range lines {
			rows = append(rows, []string{"  " + line})
		}
	}
	widths := make([]int, len(columns)+1)
	for _, row := range rows {
		if len(row) == 1 {
			continue // a heading spans the row
		}
		for i, c := range row {
			widths[i] = max(widths[i], utf8.RuneCountInString(c))
		}
	}
	b := &strings.Builder{}
	for _, row := range rows {
		for i, c := range row {
			pad := strings.Repeat(" ", max(0, widths[i]-utf8.RuneCountInString(c)))
			switch {
			case len(row) == 1:
				b.WriteString(c)
			case i == 0:
				b.WriteString(c + pad)
			default:
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
	}
	if line, _ := r.timeGate(); line != "" {
		fmt.Fprintf(b, "\n%s\n", line)
	}
	if err := r.Err(); err != nil {
		fmt.Fprintf(b, "\nFAILED:\n%v\n", err)
	}
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	return nil
}

// cells returns a run's figures, as columns lists them; "—" where none.
func (r *Report) cells(s ScenarioReport, run RunReport) []string {
	res := run.Result
	c := make([]string, len(columns))
	for i := range c {
		c[i] = "—"
	}
	if eps := res.EffectsPerSecond(); eps > 0 {
		c[0] = thousands(eps)
	}
	switch {
	case run.Baseline:
		c[1] = "1×"
	case s.ratio(run) > 0:
		c[1] = fmt.Sprintf("%.2f×", s.ratio(run))
	}
	if res.Steady > 0 {
		c[2] = thousands(res.Steady)
	}
	if res.StartUp > 0 {
		c[3] = seconds(res.StartUp)
	}
	if l := res.Latency; l != nil {
		c[4], c[5], c[6] = ms(l.P50), ms(l.P99), thousands(l.Rate)+"/s"
	}
	if res.AllocsPerMessage > 0 {
		c[7] = thousands(res.AllocsPerMessage)
	}
	if res.PeakRSS > 0 {
		c[8] = fmt.Sprintf("%d MiB", res.PeakRSS>>20)
	}
	if res.CPU.Machine > 0 {
		c[9] = fmt.Sprintf("%.2f cores", res.CPU.Consumer)
		c[10] = fmt.Sprintf("%.0f%%", res.CPU.Machine*100)
	}
	switch {
	case run.Err != nil:
		c[11] = "FAILED"
	case res.Events > 0:
		c[11] = fmt.Sprintf("%d = %d", res.Effects, res.Events)
	}
	return c
}

// WriteMarkdown writes the report as docs/benchmarks.md.
func (r *Report) WriteMarkdown(w io.Writer) error {
	b := &strings.Builder{}
	m := r.Machine
	fmt.Fprintf(b, "# Benchmarks\n\n")
	fmt.Fprintf(b, "What the framework costs against the hand-written Watermill consumer a team\n"+
		"would write instead, each scenario side by side with its baseline in one run\n"+
		"of `make bench` (this page is its output). The consumers run as processes of\n"+
		"their own on real servers; every run checks that the consumer left exactly one\n"+
		"effect per distinct event (counted in its table) and fails otherwise.\n\n")
	fmt.Fprintf(b, "## Machine\n\n")
	fmt.Fprintf(b, "- Date: %s\n", r.Date.UTC().Format("2006-01-02 15:04 UTC"))
	fmt.Fprintf(b, "- CPU: %s, %d cores; RAM %.1f GiB; load average at start %s\n", orDash(m.CPU), m.Cores, float64(m.MemBytes)/(1<<30), orDash(m.LoadAvg))
	fmt.Fprintf(b, "- %s, %s", m.Go, m.OS)
	if m.Postgres != "" {
		fmt.Fprintf(b, ", PostgreSQL %s", m.Postgres)
	}
	if m.RabbitMQ != "" {
		fmt.Fprintf(b, ", RabbitMQ %s", m.RabbitMQ)
	}
	fmt.Fprintf(b, " (servers on the same machine)\n")
	var scaled []string
	for _, s := range r.Scenarios {
		if s.Scale > 0 && s.Scale != 1 && !r.Options.Smoke {
			scaled = append(scaled, fmt.Sprintf("%s in those of %s", thousands(float64(scaledEvents(r.Options.Events, s.Scale))), s.Title))
		}
	}
	fmt.Fprintf(b, "- Size: %s messages per run", thousands(float64(r.Options.Events)))
	if len(scaled) > 0 {
		fmt.Fprintf(b, " (%s)", strings.Join(scaled, ", "))
	}
	fmt.Fprintf(b, ", %.0f%% of them duplicates; latency phase %s\n", r.Options.Duplicates*100, r.Options.LatencyDuration)
	if r.Options.Rounds > 1 {
		var once, more []string
		for _, s := range r.Scenarios {
			switch {
			case s.Once:
				once = append(once, s.Title)
			case s.Rounds > r.Options.Rounds:
				more = append(more, fmt.Sprintf("%s (%d times)", s.Title, s.Rounds))
			}
		}
		fmt.Fprintf(b, "- Rounds: each run measured %d times, in rounds (every run of a scenario once a round, in the order listed, the other way round every other round)", r.Options.Rounds)
		if len(once) > 0 {
			fmt.Fprintf(b, ", but those of %s (once)", strings.Join(once, " and "))
		}
		if len(more) > 0 {
			fmt.Fprintf(b, ", and those of %s, whose runs drain in under a second", strings.Join(more, " and "))
		}
		fmt.Fprintf(b, "; the figures are those of the round with the median effects/s, but steady/s, start-up, p50 and p99, each the median of its rounds; the effects/s of every round follow each scenario's table\n")
	}
	if r.Elapsed > 0 {
		fmt.Fprintf(b, "- Time: %s in all", r.Elapsed.Round(time.Second))
		if line, _ := r.timeGate(); line != "" {
			fmt.Fprintf(b, " (%s)", strings.TrimPrefix(line, "Gate: "))
		}
		fmt.Fprintf(b, "; each scenario's below its heading\n")
	}
	fmt.Fprintln(b)

	fmt.Fprintf(b, "## Summary\n\n| scenario | run | effects/s | ratio |\n|---|---|---:|---:|\n")
	for _, s := range r.Scenarios {
		for _, run := range s.Runs {
			c := r.cells(s, run)
			fmt.Fprintf(b, "| %s | %s | %s | %s |\n", s.Title, run.Name, c[0], c[1])
		}
	}
	fmt.Fprintln(b)
	var gates []string
	for _, s := range r.Scenarios {
		lines, _ := s.gate(r.Options.Smoke)
		for _, line := range lines {
			gates = append(gates, "- "+s.Title+": "+strings.TrimPrefix(line, "Gate: ")+".")
		}
	}
	if line, _ := r.timeGate(); line != "" {
		gates = append(gates, "- "+strings.TrimPrefix(line, "Gate: ")+".")
	}
	if len(gates) > 0 {
		fmt.Fprintf(b, "Gates (a gate not met fails `make bench`):\n\n%s\n\n", strings.Join(gates, "\n"))
	}
	fmt.Fprintf(b, "%s\n", findings)

	fmt.Fprintf(b, "## How to reproduce\n\n"+
		"```sh\nmake bench                                          # starts PostgreSQL and RabbitMQ as make test does\n"+
		"make bench BENCHFLAGS=\"-events 2000 -run 'amqp|sqlite'\"   # smaller, some scenarios\n"+
		"make bench BENCHFLAGS=\"-rounds 1\"                 # each run once (three rounds by default)\n"+
		"make bench BENCHFLAGS=\"-smoke -run 'sqlite/default|raw'\"   # two runs of one scenario, no report written\n"+
		"go run ./internal/tools/bench/cmd/bench -h                # every flag (servers from EFFECTIVELY_TEST_*_URL)\n```\n\n"+
		"Run it on a quiet machine: the consumers, the servers and the producer share\n"+
		"its cores, and anything else running shows in the figures (the load average\n"+
		"above says how quiet it was). `TestSmoke` in `internal/tools/bench` runs every\n"+
		"scenario at 100 messages inside `make test`, checking the effects only.\n\n")

	fmt.Fprintf(b, "## How to read the figures\n\n"+
		"- **effects/s**: the consumer draining a backlog, from its first effect to its last.\n"+
		"- **ratio**: effects/s over the scenario's baseline's, in the same run (each the\n"+
		"  round with the median effects/s of its run).\n"+
		"- **steady/s**: the drain's steady state: effects/s from the effect after the\n"+
		"  first 10%% of them to the last, the consumer's first batches left out.\n"+
		"- **start-up**: from the consumer's process start to its first effect, the\n"+
		"  backlog waiting for it: the process's own start, its connections, migrations\n"+
		"  and subscriptions, its first batch.\n"+
		"- **p50 / p99**: end-to-end latency, from a paced producer's send to the effect's\n"+
		"  write in the consumer's transaction, with the producer at half the drain rate\n"+
		"  (**at rate**), fresh events one at a time.\n"+
		"- **allocs/msg**: the consumer process's heap allocations during the drain\n"+
		"  (`go_memstats_mallocs_total` on its /metrics) over the messages drained.\n"+
		"- **peak RSS**: the consumer process's VmHWM.\n"+
		"- **Memory along the drain** (the memory scenario): the consumer's resident set\n"+
		"  (VmRSS), its anonymous part (RssAnon), its peak so far (VmHWM) and its Go heap\n"+
		"  in use, read each tenth of the way; **growth** is from the first reading to the\n"+
		"  last.\n"+
		"- **CPU**: during the drain, the cores the consumer's process used on average,\n"+
		"  and how busy the machine's cores were (consumer, servers and all). Below each\n"+
		"  scenario's table, the same drain's CPU time in µs a message handled, by process:\n"+
		"  the consumer's, RabbitMQ's (the Erlang VM), PostgreSQL's (every `postgres`\n"+
		"  process: backends, WAL writer, checkpointer), the benchmark's own (the sink that\n"+
		"  counts the relay's messages, the pollers of the effects), and the rest of the\n"+
		"  machine's busy time (the kernel's threads, other processes, and the groups with\n"+
		"  less than 2%% of a run's time, which get no column; at least 0, as the processes'\n"+
		"  times are read apart from the machine's, in ticks of 10 ms). Each process's user\n"+
		"  and system time is read from `/proc/PID/stat` every 250 ms. The benchmark runs its\n"+
		"  goroutines on one thread (GOMAXPROCS 1; the consumers have every core), so that\n"+
		"  its sink wakes no second thread for each message it hands on.\n"+
		"- **effects**: effects counted in the consumer's table, once it stopped = distinct\n"+
		"  events fed (the drain's and the latency phase's); a run fails on any difference.\n\n")

	fmt.Fprintf(b, "## Figures\n\n")
	for _, s := range r.Scenarios {
		fmt.Fprintf(b, "### %s\n\n", s.Title)
		if s.Elapsed > 0 {
			fmt.Fprintf(b, "Measured in %s.\n\n", s.Elapsed.Round(time.Second))
		}
		if s.About != "" {
			fmt.Fprintf(b, "%s\n\n", s.About)
		}
		if s.Skipped != "" {
			fmt.Fprintf(b, "Skipped: %s.\n\n", s.Skipped)
			continue
		}
		fmt.Fprintf(b, "| run | %s |\n", strings.Join(columns, " | "))
		fmt.Fprintf(b, "|---%s|\n", strings.Repeat("|---:", len(columns)))
		for _, run := range s.Runs {
			c := r.cells(s, run)
			name := run.Name
			if run.Baseline {
				name += " (baseline)"
			}
			fmt.Fprintf(b, "| %s | %s |\n", name, strings.Join(c, " | "))
		}
		fmt.Fprintln(b)
		lines, _ := s.gate(r.Options.Smoke)
		for _, line := range lines {
			fmt.Fprintf(b, "%s.\n\n", line)
		}
		writeRounds(b, s)
		writeSweeps(b, s)
		writeCPUGroups(b, s)
		for _, run := range s.Runs {
			writeMemory(b, run)
		}
		for _, run := range s.Runs {
			if run.Err != nil {
				fmt.Fprintf(b, "**%s failed**: %v\n\n", run.Name, run.Err)
			}
			if run.Result.Note != "" {
				fmt.Fprintf(b, "%s: %s\n\n", run.Name, run.Result.Note)
			}
		}
		for _, run := range s.Runs {
			bound := run.Result.CPU.bound(m.Cores)
			if bound == "" && len(run.Result.Profile) == 0 {
				continue
			}
			fmt.Fprintf(b, "What bounds **%s**: %s", run.Name, bound)
			if len(run.Result.Profile) > 0 {
				fmt.Fprintf(b, " The top of its CPU profile, over its whole life (start, drain, latency phase):\n\n```\n%s\n```", strings.Join(run.Result.Profile, "\n"))
			}
			fmt.Fprintf(b, "\n\n")
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeCPUGroups writes the CPU time of each run's drain in µs a
// message, by group of processes, as a table; only the groups that took
// a part of a run's (see shownGroups) have a column. Nothing when no run
// has them.
func writeCPUGroups(b *strings.Builder, s ScenarioReport) {
	cpus := make([]CPU, len(s.Runs))
	for i, run := range s.Runs {
		cpus[i] = run.Result.CPU
	}
	shown := shownGroups(cpus...)
	var rows []string
	for _, run := range s.Runs {
		groups, machine, ok := run.Result.CPU.PerMessage()
		if !ok {
			continue
		}
		cells := []string{run.Name}
		for _, g := range shown {
			cells = append(cells, fmt.Sprintf("%.0f", groups[g]))
		}
		cells = append(cells, fmt.Sprintf("%.0f", restOf(groups, machine, shown)), fmt.Sprintf("%.0f", machine))
		rows = append(rows, "| "+strings.Join(cells, " | ")+" |")
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintf(b, "CPU during the drain, in µs a message:\n\n| run | %s | rest | all |\n|---%s|\n%s\n\n",
		strings.Join(shown, " | "), strings.Repeat("|---:", len(shown)+2), strings.Join(rows, "\n"))
}

// shownGroups returns the groups, in cpuGroups' order, that took 2% of
// the machine's time a message at least in one of cpus, so that a server
// that only idles beside a run (RabbitMQ's timers in a SQLite run) gets
// no figure.
func shownGroups(cpus ...CPU) []string {
	var shown []string
	for _, g := range cpuGroups() {
		for _, c := range cpus {
			if groups, machine, ok := c.PerMessage(); ok && groups[g] >= max(0.5, 0.02*machine) {
				shown = append(shown, g)
				break
			}
		}
	}
	return shown
}

// restOf returns the machine's CPU time a message less that of the
// groups shown, at least 0 (the processes' times are read apart from the
// machine's).
func restOf(groups map[string]float64, machine float64, shown []string) float64 {
	for _, g := range shown {
		machine -= groups[g]
	}
	return max(0, machine)
}

// perMessageLine is the CPU time of the drain in µs a message, by group,
// in a line of text; empty when the groups were not read.
func (c CPU) perMessageLine() string {
	groups, machine, ok := c.PerMessage()
	if !ok {
		return ""
	}
	shown := shownGroups(c)
	parts := make([]string, 0, len(shown)+1)
	for _, g := range shown {
		parts = append(parts, fmt.Sprintf("%s %.0f", g, groups[g]))
	}
	parts = append(parts, fmt.Sprintf("rest %.0f", restOf(groups, machine, shown)))
	return fmt.Sprintf("CPU µs/message: %s; all %.0f", strings.Join(parts, ", "), machine)
}

// writeRounds writes the effects per second of each round of the runs
// measured more than once, and the ratio of the medians' rounds.
func writeRounds(b *strings.Builder, s ScenarioReport) {
	var lines []string
	for _, run := range s.Runs {
		if len(run.Rounds) < 2 {
			continue
		}
		rates := make([]string, len(run.Rounds))
		for i, eps := range run.Rounds {
			rates[i] = thousands(eps)
		}
		lines = append(lines, fmt.Sprintf("- %s: %s", run.Name, strings.Join(rates, ", ")))
	}
	if len(lines) == 0 {
		return
	}
	fmt.Fprintf(b, "Effects/s of each round:\n\n%s\n\n", strings.Join(lines, "\n"))
}

func orDash(s string) string {
	if s == "" {
		return "—"
	}
	return s
}

// thousands formats v rounded, with commas between thousands.
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	var out []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// seconds formats d in seconds, to the hundredth.
func seconds(d time.Duration) string {
	return fmt.Sprintf("%.2f s", d.Seconds())
}

func ms(d time.Duration) string {
	switch {
	case d >= 100*time.Millisecond:
		return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond))
	}
}
