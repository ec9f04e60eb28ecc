package soak

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/rabbitmq/amqp091-go"

	_ "github.com/jackc/pgx/v5/stdlib" // the figures' queries
)

// Options configure a soak run.
type Options struct {
	// Events is how many events are sent, duplicates included.
	Events int
	// Seed makes the plan (NewPlan).
	Seed uint64
	// Rate is how many events per second the producer writes.
	Rate float64
	// Cluster runs RabbitMQ as a three-node cluster of the soak's own,
	// with quorum queues, and kills one node mid-run; otherwise AMQPURL
	// names the one node to use, with the consumers' default (classic)
	// queues.
	Cluster bool
	AMQPURL string
	// KillEvery bounds the random pause between two SIGKILLs of a
	// consumer process.
	KillEvery [2]time.Duration
	// Settle bounds the wait for the consumers to finish after the
	// producer did.
	Settle time.Duration
	// Log receives the run's progress and its report.
	Log io.Writer
}

// run is one soak run's state.
type run struct {
	opts  Options
	plan  Plan
	svc   *service
	pg    *Postgres
	nodes []*RabbitNode
	db    *sqlx.DB
	start time.Time
	// amqpURLs are the RabbitMQ nodes, separated by commas.
	amqpURLs string

	mu     sync.Mutex
	faults []string
}

func (r *run) logf(format string, args ...any) {
	fmt.Fprintf(r.opts.Log, "soak %6.1fs: %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (r *run) fault(format string, args ...any) {
	s := fmt.Sprintf("%s at %.0fs", fmt.Sprintf(format, args...), time.Since(r.start).Seconds())
	r.logf("%s", s)
	r.mu.Lock()
	r.faults = append(r.faults, s)
	r.mu.Unlock()
}

// Run runs the soak: it starts its servers, the producer and two
// consumer processes, kills the consumers at random, restarts
// PostgreSQL once and (with Cluster) kills a RabbitMQ node and brings it
// back, then discards the poison and returns the figures. A returned
// error is a fault of the run itself; Report.Check judges the figures.
// The service's processes die with the calling process; the servers,
// daemons, are stopped by Run, and inherit none of its descriptors.
func Run(ctx context.Context, opts Options) (Report, error) {
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	closeInheritedOnExec()
	r := &run{opts: opts, plan: NewPlan(opts.Events, opts.Seed), start: time.Now()}
	dir, err := os.MkdirTemp("", "effectively-soak-")
	if err != nil {
		return Report{}, fmt.Errorf("soak: %w", err)
	}
	defer os.RemoveAll(dir)
	bin, err := buildService(ctx, dir)
	if err != nil {
		return Report{}, err
	}
	r.logf("service built")
	if r.pg, err = StartPostgres(ctx); err != nil {
		return Report{}, err
	}
	defer func() { _ = r.pg.Close(context.WithoutCancel(ctx)) }()
	r.logf("PostgreSQL started: %s", r.pg.URL())
	urls, queueType, err := r.startRabbitMQ(ctx)
	defer r.closeRabbitMQ(context.WithoutCancel(ctx))
	if err != nil {
		return Report{}, err
	}
	r.amqpURLs = urls
	r.logf("RabbitMQ: %s (%s queues)", urls, queueType)
	if r.db, err = sqlx.Open("pgx", r.pg.URL()); err != nil {
		return Report{}, fmt.Errorf("soak: %w", err)
	}
	defer r.db.Close()
	logDir := filepath.Join(dir, "logs")
	if err := os.Mkdir(logDir, 0o755); err != nil {
		return Report{}, fmt.Errorf("soak: %w", err)
	}
	r.svc = &service{bin: bin, dir: logDir, vars: []string{
		"EFFECTIVELY_TRANSPORT=amqp",
		"EFFECTIVELY_DATABASE_URL=" + r.pg.URL(),
		"EFFECTIVELY_AMQP_URL=" + urls,
		"EFFECTIVELY_AMQP_QUEUE_TYPE=" + queueType,
	}}
	report, err := r.soak(ctx, dir)
	if err == nil {
		err = report.Check()
		if err == nil {
			return report, nil
		}
		err = nil // the caller judges the figures
	}
	for _, name := range []string{"consumer-1", "consumer-2", "producer"} {
		r.logf("tail of %s's log:\n%s", name, tail(filepath.Join(logDir, name+".log"), 2000))
	}
	if kept, kerr := os.MkdirTemp("", "effectively-soak-logs-"); kerr == nil && os.Rename(logDir, filepath.Join(kept, "logs")) == nil {
		r.logf("the service's logs are kept in %s", filepath.Join(kept, "logs"))
	}
	return report, err
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// buildService builds the soak's service into dir.
func buildService(ctx context.Context, dir string) (string, error) {
	gomod, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("soak: go env GOMOD: %w", err)
	}
	bin := filepath.Join(dir, "soakservice")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./internal/tools/soak/cmd/soakservice")
	cmd.Dir = filepath.Dir(strings.TrimSpace(string(gomod)))
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("soak: build the service: %w: %s", err, out)
	}
	return bin, nil
}

// startRabbitMQ starts the cluster, or clears the soak's queues of the
// one node, and returns the URLs and the queue type.
func (r *run) startRabbitMQ(ctx context.Context) (string, string, error) {
	if !r.opts.Cluster {
		return r.opts.AMQPURL, "classic", clearQueues(r.opts.AMQPURL)
	}
	urls := make([]string, 3)
	for i := range 3 {
		n, err := NewRabbitNode(fmt.Sprintf("effectively-soak-%d", i+1))
		if err != nil {
			return "", "", err
		}
		r.nodes = append(r.nodes, n)
		urls[i] = n.URL()
	}
	var wg sync.WaitGroup
	errs := make([]error, 3)
	for i, n := range r.nodes {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = n.Start(ctx) }()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return "", "", err
	}
	for _, n := range r.nodes[1:] {
		if err := n.Join(ctx, r.nodes[0]); err != nil {
			return "", "", err
		}
	}
	return strings.Join(urls, ","), "quorum", nil
}

func (r *run) closeRabbitMQ(ctx context.Context) {
	if !r.opts.Cluster {
		_ = clearQueues(r.opts.AMQPURL)
	}
	for _, n := range r.nodes {
		_ = n.Close(ctx)
	}
}

// clearQueues deletes the soak's queues and exchange from a node that
// other runs share.
func clearQueues(url string) error {
	conn, err := amqp091.Dial(url)
	if err != nil {
		return fmt.Errorf("soak: RabbitMQ at %s: %w", url, err)
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return fmt.Errorf("soak: RabbitMQ channel: %w", err)
	}
	for _, q := range []string{EffectsConsumer, ProjectionConsumer} {
		if _, err := ch.QueueDelete(q, false, false, false); err != nil {
			return fmt.Errorf("soak: delete queue %s: %w", q, err)
		}
	}
	if err := ch.ExchangeDelete(Recorded.Type(), false, false); err != nil {
		return fmt.Errorf("soak: delete exchange: %w", err)
	}
	return nil
}

// soak runs the service's processes and the faults.
func (r *run) soak(ctx context.Context, dir string) (Report, error) {
	consumerConfig := filepath.Join(dir, "consumers.yaml")
	if err := os.WriteFile(consumerConfig, []byte("consumers:\n  "+ProjectionConsumer+":\n    strict_order: true\n"), 0o644); err != nil {
		return Report{}, fmt.Errorf("soak: %w", err)
	}
	if err := r.migrate(ctx); err != nil {
		return Report{}, err
	}
	consumerVars := []string{"EFFECTIVELY_CONFIG=" + consumerConfig}
	c := &consumers{run: r, vars: consumerVars, procs: make([]*proc, 2)}
	for i := range c.procs {
		name := fmt.Sprintf("consumer-%d", i+1)
		p, err := r.svc.start(ctx, name, time.Minute, consumerEnv(name, consumerVars)...)
		if err != nil {
			return Report{}, err
		}
		c.procs[i] = p
	}
	defer func() { _ = c.stopAll() }() // the report is made; a consumer killed at random may have exited
	r.start = time.Now()
	producer, err := r.svc.start(ctx, "producer", time.Minute,
		EnvRole+"=producer", EnvEvents+"="+strconv.Itoa(r.opts.Events),
		EnvSeed+"="+strconv.FormatUint(r.opts.Seed, 10), EnvRate+"="+strconv.FormatFloat(r.opts.Rate, 'f', -1, 64))
	if err != nil {
		return Report{}, err
	}
	defer func() { _ = producer.stop(30 * time.Second) }()
	r.logf("producer and two consumers running; %d events at %.0f/s, seed %d", r.opts.Events, r.opts.Rate, r.opts.Seed)

	chaos, stopChaos := context.WithCancel(ctx)
	chaosDone := make(chan error, 1)
	go func() { chaosDone <- c.killAtRandom(chaos) }()
	err = r.faultsWhileProducing(ctx)
	if err == nil {
		err = r.waitDuplicates(ctx)
	}
	stopChaos()
	if cerr := <-chaosDone; cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return Report{}, err
	}
	r.logf("produced; %d consumer processes killed so far", c.kills)
	resolved := r.resolve(ctx)
	if resolved != nil {
		r.logf("not settled:%s", r.pending(ctx))
		for _, p := range c.procs {
			r.logf("%s's own figures: %s", p.name, p.figures(ctx))
		}
	}
	if err := c.stopAll(); err != nil {
		return Report{}, err
	}
	report, err := r.report(ctx)
	if resolved != nil || report.Parked != 0 {
		r.diagnose(ctx) // not settled, or a parked event left
	}
	report.Kills, report.Faults, report.Took = c.kills, r.faults, time.Since(r.start)
	return report, errors.Join(err, resolved)
}

// produced returns how many events the producer wrote and how many
// duplicates it published.
func (r *run) produced(ctx context.Context) (int, int, error) {
	var row struct{ Events, Duplicates int }
	err := r.db.GetContext(ctx, &row, `SELECT events, duplicates FROM soak_produced WHERE id = 1`)
	return row.Events, row.Duplicates, err
}

// faultsWhileProducing restarts PostgreSQL once, at half the plan, and
// kills a RabbitMQ node at a third and starts it at two thirds, then
// waits for the producer's last event.
func (r *run) faultsWhileProducing(ctx context.Context) error {
	distinct := len(r.plan.Items)
	steps := []struct {
		at   int
		what string
		do   func(context.Context) error
	}{
		{distinct / 2, "PostgreSQL restarted (immediate stop)", r.pg.Restart},
	}
	if r.opts.Cluster {
		node := r.nodes[0] // the first URL: every client is connected to it
		steps = []struct {
			at   int
			what string
			do   func(context.Context) error
		}{
			{distinct / 3, "RabbitMQ node " + node.Name + " killed (SIGKILL)", func(context.Context) error { return node.Kill() }},
			{distinct / 2, "PostgreSQL restarted (immediate stop)", r.pg.Restart},
			{distinct * 2 / 3, "RabbitMQ node " + node.Name + " started again", node.Start},
		}
	}
	deadline := time.Now().Add(time.Duration(float64(distinct)/r.opts.Rate*float64(time.Second)) + 3*time.Minute)
	for {
		n, _, err := r.produced(ctx)
		if err == nil {
			for len(steps) > 0 && n >= steps[0].at {
				if err := steps[0].do(ctx); err != nil {
					return fmt.Errorf("soak: %s: %w", steps[0].what, err)
				}
				r.fault("%s (%d events written)", steps[0].what, n)
				steps = steps[1:]
			}
			if n >= distinct && len(steps) == 0 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return lastError(fmt.Sprintf("soak: the producer wrote %d of %d events", n, distinct), err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (r *run) waitDuplicates(ctx context.Context) error {
	want := r.plan.Figures().Duplicates
	return r.until(ctx, time.Minute, "the duplicates published", func() (bool, error) {
		_, d, err := r.produced(ctx)
		return d >= want, err
	})
}

// progressEvery is how often settle logs what is pending.
const progressEvery = 15 * time.Second

// until polls done every half second until it is true or timeout passes.
func (r *run) until(ctx context.Context, timeout time.Duration, what string, done func() (bool, error)) error {
	deadline := time.Now().Add(timeout)
	var last error
	for {
		ok, err := done()
		if ok && err == nil {
			return nil
		}
		if err != nil {
			last = err
		}
		if time.Now().After(deadline) {
			return lastError(fmt.Sprintf("soak: %s: not within %s", what, timeout), last)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

func (r *run) count(ctx context.Context, query string, args ...any) (int, error) {
	var n int
	err := r.db.GetContext(ctx, &n, query, args...)
	return n, err
}

// discardRounds bounds the rounds of resolve: a subject's second poison
// event, parked behind its first, becomes a dead letter in its turn once
// the first is discarded, and so on.
const discardRounds = 10

// resolve waits until the consumers settled, then discards the pending
// dead letters (the poison), and again while discarding them released
// parked events that ended as dead letters in their turn.
func (r *run) resolve(ctx context.Context) error {
	for round := 1; round <= discardRounds; round++ {
		if err := r.settle(ctx, round); err != nil {
			return err
		}
		n, err := r.discardPoison(ctx)
		if err != nil || n == 0 {
			return err
		}
	}
	return fmt.Errorf("soak: dead letters still pending after %d rounds of discards", discardRounds)
}

// qAccounted counts the distinct events of a consumer ($1) that took
// effect, are dead letters, or are parked behind a dead letter of their
// subject.
const qAccounted = `SELECT count(*) FROM (
    SELECT event_id FROM soak_effects WHERE consumer = $1
    UNION SELECT event_id FROM dead_letters WHERE consumer = $1
    UNION SELECT p.event_id FROM parked_events p
    LEFT JOIN subject_checkpoints c ON c.consumer = p.consumer AND c.subject = p.subject
    WHERE p.consumer = $1 AND p.reason = 'parked' AND EXISTS (SELECT 1 FROM parked_events h
        WHERE h.consumer = p.consumer AND h.subject = p.subject AND h.reason = 'dead_letter'
        AND h.seq < p.seq AND h.seq > COALESCE(c.seq, 0))
) accounted`

// settle waits until each consumer accounts for every distinct event
// (qAccounted), with no parked event whose turn came and no replay
// unsent: what is left waits for an operator. Every progressEvery it logs
// what is pending. The first round may take Options.Settle, the others
// two minutes.
func (r *run) settle(ctx context.Context, round int) error {
	distinct := r.plan.Figures().Distinct
	timeout := r.opts.Settle
	if round > 1 {
		timeout = 2 * time.Minute
	}
	logged := time.Now()
	err := r.until(ctx, timeout, "every event handled", func() (bool, error) {
		if time.Since(logged) >= progressEvery {
			logged = time.Now()
			r.logf("settling:%s", r.pending(ctx))
		}
		for _, c := range []string{EffectsConsumer, ProjectionConsumer} {
			n, err := r.count(ctx, qAccounted, c)
			if err != nil || n < distinct {
				return false, err
			}
		}
		busy, err := r.count(ctx, `SELECT (SELECT count(*) FROM replays WHERE sent_at IS NULL) + (SELECT count(*) FROM parked_events p
LEFT JOIN subject_checkpoints c ON c.consumer = p.consumer AND c.subject = p.subject
WHERE p.reason = 'parked' AND p.seq = COALESCE(c.seq, 0) + 1)`)
		return busy == 0, err
	})
	r.logf("consumers settled, round %d (%v)", round, err)
	return err
}

// discardPoison discards every pending dead letter, the projection's with
// --release-parked, through the service's command line, and returns how
// many it discarded.
func (r *run) discardPoison(ctx context.Context) (int, error) {
	discarded := 0
	for _, c := range []struct {
		consumer string
		flags    []string
	}{{EffectsConsumer, nil}, {ProjectionConsumer, []string{"--release-parked"}}} {
		var ids []string
		if err := r.db.SelectContext(ctx, &ids, `SELECT id::text FROM dead_letters WHERE consumer = $1 AND status = 'pending' ORDER BY id`, c.consumer); err != nil {
			return discarded, fmt.Errorf("soak: dead letters of %s: %w", c.consumer, err)
		}
		for len(ids) > 0 {
			chunk := ids[:min(len(ids), 500)]
			ids = ids[len(chunk):]
			args := append([]string{"dead-letters", "discard", "--by", "soak", "--reason", "poison of the soak"}, c.flags...)
			if _, err := r.svc.command(ctx, append(args, chunk...)...); err != nil {
				return discarded, err
			}
			discarded += len(chunk)
		}
	}
	r.logf("%d dead letters discarded", discarded)
	return discarded, nil
}

// report reads the figures.
func (r *run) report(ctx context.Context) (Report, error) {
	rep := Report{Figures: r.plan.Figures(), Effects: map[string]int{}, Doubled: map[string]int{}, DeadLetters: map[string]int{}}
	var rows []struct {
		Consumer string
		N, D     int
	}
	q := `SELECT consumer, count(*) AS n, count(*) - count(DISTINCT event_id) AS d FROM soak_effects GROUP BY consumer`
	if err := r.db.SelectContext(ctx, &rows, q); err != nil {
		return rep, fmt.Errorf("soak: effects: %w", err)
	}
	for _, row := range rows {
		rep.Effects[row.Consumer], rep.Doubled[row.Consumer] = row.N, row.D
	}
	var dls []struct {
		Consumer, Code, Status string
		N                      int
	}
	if err := r.db.SelectContext(ctx, &dls, `SELECT consumer, code, status, count(*) AS n FROM dead_letters GROUP BY consumer, code, status`); err != nil {
		return rep, fmt.Errorf("soak: dead letters: %w", err)
	}
	for _, d := range dls {
		rep.DeadLetters[d.Consumer+" "+d.Code+" "+d.Status] = d.N
		if d.Status == "pending" {
			rep.PendingDeadLetters += d.N
		}
	}
	var subjects []struct {
		Subject string
		LastSeq int64 `db:"last_seq"`
		Applied int64
	}
	if err := r.db.SelectContext(ctx, &subjects, `SELECT subject, last_seq, applied FROM soak_projection`); err != nil {
		return rep, fmt.Errorf("soak: projection: %w", err)
	}
	want := r.plan.Expected()
	rep.Subjects = len(want)
	for _, s := range subjects {
		rep.Applied += int(s.Applied)
		if w, ok := want[s.Subject]; ok && w == [2]int64{s.LastSeq, s.Applied} {
			rep.Complete++
		}
	}
	var err error
	if rep.Parked, err = r.count(ctx, `SELECT count(*) FROM parked_events`); err != nil {
		return rep, fmt.Errorf("soak: parked: %w", err)
	}
	if rep.Unsent, err = r.count(ctx, `SELECT count(*) FROM outbox WHERE sent_at IS NULL`); err != nil {
		return rep, fmt.Errorf("soak: outbox: %w", err)
	}
	return rep, nil
}

// consumers are the two consumer processes, killed at random.
type consumers struct {
	run   *run
	vars  []string
	mu    sync.Mutex
	procs []*proc
	kills int
}

// killAtRandom kills one of the consumers with SIGKILL after a random
// pause in KillEvery and starts it again, until ctx ends.
func (c *consumers) killAtRandom(ctx context.Context) error {
	lo, hi := c.run.opts.KillEvery[0], c.run.opts.KillEvery[1]
	for {
		pause := lo + time.Duration(rand.Int64N(int64(hi-lo)+1))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(pause):
		}
		i := rand.IntN(len(c.procs))
		c.mu.Lock()
		p := c.procs[i]
		c.mu.Unlock()
		p.kill()
		c.kills++
		for {
			// A restart may fail while PostgreSQL or a node is down: try
			// again.
			np, err := c.run.svc.start(context.WithoutCancel(ctx), p.name, time.Minute, consumerEnv(p.name, c.vars)...)
			if err == nil {
				c.mu.Lock()
				c.procs[i] = np
				c.mu.Unlock()
				break
			}
			c.run.logf("restart %s: %v", p.name, err)
			time.Sleep(time.Second)
		}
	}
}

// stopAll stops the consumers (SIGTERM), once.
func (c *consumers) stopAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for i, p := range c.procs {
		if p != nil {
			errs = append(errs, p.stop(time.Minute))
			c.procs[i] = nil
		}
	}
	return errors.Join(errs...)
}

// lastError is the error msg, wrapping last, the last error seen on the
// way, when there was one.
func lastError(msg string, last error) error {
	if last == nil {
		return errors.New(msg)
	}
	return fmt.Errorf("%s (last error: %w)", msg, last)
}
