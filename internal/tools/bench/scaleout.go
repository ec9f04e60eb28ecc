package bench

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
)

// The scale-out scenarios: the example service's consumer, partitioned,
// with strict_order and a handler that waits ScaleOutWait, drained by 1,
// 2 and 4 processes at once.
const (
	// ScaleOutWait is how long each handler of the scale-out scenarios
	// waits, outside the database.
	ScaleOutWait = 50 * time.Millisecond
	// ScaleOutConcurrency is the consumer's concurrency in each process.
	ScaleOutConcurrency = 16
	// ScaleOutPartitions is the consumer's partitions.
	ScaleOutPartitions = 4
	// ScaleOutScale is the share of Options.Events the scale-out
	// scenarios drain: half of it, 10,000 events at the default size (32 s
	// for one process at its ceiling, 9 s for four), long enough for a
	// steady figure, since the processes' start-up and the partitions'
	// handover are left out of the timing. Their drains are bound by the
	// handler's wait, not by the machine: at the whole of Options.Events
	// the two scenarios took 12 of the 24 minutes of make bench, whose
	// budget is 25.
	ScaleOutScale = 0.5
	// ScaleOutFloor is the share of one process's ceiling (concurrency ÷
	// wait: 320 effects/s) that the run of one process must reach.
	ScaleOutFloor = 0.8
	// ScaleOutGain is how many times the effects per second of one
	// process that four must reach.
	ScaleOutGain = 3
	// ScaleOutPerSubject is how many events each subject has: 1,000
	// subjects at the default size.
	ScaleOutPerSubject = 10
)

// The runs of the scale-out scenarios.
const (
	scaleOut1 = "1 process"
	scaleOut2 = "2 processes"
	scaleOut4 = "4 processes"
)

// scaleOutConfig is the example's configuration file of the scale-out
// scenarios: the consumer's own entry.
var scaleOutConfig = fmt.Sprintf("consumers:\n  %s:\n    strict_order: true\n    concurrency: %d\n    partitions: %d\n",
	serviceQueue, ScaleOutConcurrency, ScaleOutPartitions)

// scaleOutScenario: the partitioned example service on transport,
// drained by 1, 2 and 4 processes.
func scaleOutScenario(transport string) Scenario {
	title, needs := "PostgreSQL transport", []Need{NeedPostgres}
	feed := "inserted into the topic table by the documented `INSERT` (without the `bucket` column: the " +
		"transport computes each row's bucket from its payload)"
	if transport == "amqp" {
		title, needs = "AMQP + PostgreSQL", []Need{NeedPostgres, NeedAMQP}
		feed = "published by plain amqp091-go to the type's fanout exchange with publisher confirms, each " +
			"with its subject in the header `effectively-partition-key` (`amqp.PartitionHeader`); a process " +
			"of the service is started and stopped beforehand, on a schema of its own, so that the " +
			"consumer's consistent-hash exchange and partition queues exist when the backlog is published"
	}
	ceiling := float64(ScaleOutConcurrency) / ScaleOutWait.Seconds()
	measure := func(processes int) func(context.Context, *Env) (Result, error) {
		return func(ctx context.Context, env *Env) (Result, error) {
			return measureScaleOut(ctx, env, transport, processes)
		}
	}
	return Scenario{
		Name:  "scaleout-" + transport,
		Title: "Scale-out, partitioned consumer, " + title,
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=%s`) with `strict_order: true`, "+
			"`concurrency: %d` and `partitions: %d` in the consumer's entry and a handler that waits %s "+
			"outside the database (`%s=%s`), so that one process tops out at %d ÷ %s = %.0f effects/s. It "+
			"drains a backlog of events with `subject` and `subjectseq`, %d events a subject (%d subjects at "+
			"the default size), the subjects interleaved round robin, %s. The same configuration runs in 1, 2 "+
			"and 4 processes at once, the partitions' leases in the stores' database. The processes are "+
			"started together once the backlog is in, and the drain is timed from the moment the partitions' "+
			"leases are spread over them (each process holding its share, read from `partition_leases`) to "+
			"the last effect, over the effects written from then on: the start-up of the processes and the "+
			"partitions' handover (about 3 s, at the default `PartitionLease` of 15 s renewed every fifth of "+
			"it), while fewer processes consume, are left out. Allocations (over the whole drain) are summed "+
			"over the processes, peak RSS is the largest, CPU and profile are the first process's. Every subject's effects must have taken effect in `subjectseq` order (read "+
			"from a `bigserial` column added to `reminders`, as in the ordering scenarios) and no event may "+
			"be dead-lettered or parked. No latency phase. Gates: 1 process at least %.1f of its ceiling "+
			"(%.0f effects/s), and 4 processes at least %d × the 1-process run.",
			transport, ScaleOutConcurrency, ScaleOutPartitions, ScaleOutWait, envOutsideWait, ScaleOutWait,
			ScaleOutConcurrency, ScaleOutWait, ceiling, ScaleOutPerSubject,
			int(DefaultEvents*ScaleOutScale)/ScaleOutPerSubject, feed, ScaleOutFloor, ScaleOutFloor*ceiling,
			ScaleOutGain),
		Needs: needs,
		Runs: []Run{
			// The smoke of 2 processes goes through the code of both:
			// TestSmoke, in make test, runs only that one.
			{Name: scaleOut1, NoSmoke: true, Measure: measure(1)},
			{Name: scaleOut2, Measure: measure(2)},
			{Name: scaleOut4, NoSmoke: true, Measure: measure(4)},
		},
		Scale: ScaleOutScale,
		Gate: &Gate{
			Run: scaleOut1, Floor: ScaleOutFloor * ceiling,
			And: &Gate{Run: scaleOut4, Of: scaleOut1, Min: ScaleOutGain},
		},
	}
}

// measureScaleOut drains the ordered backlog through processes of the
// partitioned example service on transport, and checks the order of the
// effects and that nothing was dead-lettered.
func measureScaleOut(ctx context.Context, env *Env, transport string, processes int) (Result, error) {
	sys, db, err := newOrderService(ctx, env, transport, scaleOutConfig)
	if err != nil {
		return Result{}, err
	}
	vars := map[string]string{envOutsideWait: ScaleOutWait.String()}
	switch s := sys.(type) {
	case *amqpService:
		s.vars, s.processes = vars, processes
		if err := preparePartitions(ctx, env, s); err != nil {
			return Result{}, err
		}
	case *postgresService:
		s.vars, s.processes = vars, processes
	}
	if _, err := db.ExecContext(ctx, `ALTER TABLE reminders ADD COLUMN `+orderColumn+` bigserial`); err != nil {
		return Result{}, fmt.Errorf("number the reminders: %w", err)
	}
	subjects := max(1, env.Events/ScaleOutPerSubject)
	msgs, distinct, keys := orderBacklog(env.ID+"-b", env.Events, subjects, env.Duplicates)
	env.Logf("%d subjects, %d processes", subjects, processes)
	spread := &spreadFirst{System: noLatency{sys}, env: env, db: db, processes: processes}
	res, err := drainBacklog(ctx, env, spread, msgs, distinct)
	if err != nil {
		return res, err
	}
	if err := spread.fromSpread(ctx, &res); err != nil {
		return res, err
	}
	out, n, err := checkOrder(ctx, sys.Effects(), keys)
	if err != nil {
		return res, err
	}
	stopped, err := orderStopped(ctx, db, env.ID)
	switch {
	case err != nil:
		return res, err
	case stopped != "":
		return res, fmt.Errorf("%s: want none", stopped)
	case len(out) > 0:
		return res, fmt.Errorf("%d of %d subjects' effects out of subjectseq order, e.g. %s", len(out), n, out[0])
	}
	return res, nil
}

// preparePartitions makes the partitioned consumer's topology on
// RabbitMQ before s's backlog is published: its consistent-hash exchange
// and partition queues, which the consumer declares when it subscribes.
// It starts a process of the service on a schema of its own (so that its
// leases do not hold the run's partitions), stops it, unbinds the
// unpartitioned queue the feed declared, empties the partition queues and
// deletes them and the exchange after the run. The feed sets the
// partition key of each message from then on.
func preparePartitions(ctx context.Context, env *Env, s *amqpService) error {
	exchange := serviceQueue + ".partitions"
	queues := make([]string, ScaleOutPartitions)
	for i := range queues {
		queues[i] = fmt.Sprintf("%s.p%02d", serviceQueue, i)
	}
	env.Cleanup(func(context.Context) error {
		ch, err := s.conn.Channel()
		if err != nil {
			return fmt.Errorf("channel: %w", err)
		}
		defer ch.Close()
		var errs []error
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				errs = append(errs, fmt.Errorf("delete queue %s: %w", q, err))
			}
		}
		if err := ch.ExchangeDelete(exchange, false, false); err != nil {
			errs = append(errs, fmt.Errorf("delete exchange %s: %w", exchange, err))
		}
		return errors.Join(errs...)
	})
	url, _, err := openSchema(ctx, env)
	if err != nil {
		return err
	}
	vars := serviceVars("amqp", url, s.config)
	vars["EFFECTIVELY_AMQP_URL"] = env.AMQPURL
	vars["EFFECTIVELY_CPU_PROFILE"] = ""
	p, err := env.StartService(ctx, vars)
	if err != nil {
		return fmt.Errorf("declare the partitions: %w", err)
	}
	if err := p.Stop(stopTimeout); err != nil {
		return fmt.Errorf("declare the partitions: %w", err)
	}
	if err := s.ch.QueueUnbind(serviceQueue, "", EventType, nil); err != nil {
		return fmt.Errorf("unbind queue %s: %w", serviceQueue, err)
	}
	for _, q := range queues {
		if _, err := s.ch.QueuePurge(q, false); err != nil {
			return fmt.Errorf("purge queue %s (declared by the service?): %w", q, err)
		}
	}
	s.partitionKey = true
	return nil
}

// startServices starts n processes of the example service (one when n
// is below two) with the same variables, as StartService does, all at
// once, and returns the first once every one is ready, the others its
// peers (see Process). Only the first writes a CPU profile.
func (e *Env) startServices(ctx context.Context, vars map[string]string, n int) (*Process, error) {
	if n < 2 {
		return e.StartService(ctx, vars)
	}
	bin, err := e.ServiceBinary(ctx)
	if err != nil {
		return nil, err
	}
	procs := make([]*Process, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		all := map[string]string{"EFFECTIVELY_HTTP_ADDR": addr}
		var profile string
		if i == 0 && !e.Smoke {
			profile = filepath.Join(e.Dir, "service.pprof")
			all["EFFECTIVELY_CPU_PROFILE"] = profile
		}
		for k, v := range vars {
			all[k] = v
		}
		if v, ok := all["EFFECTIVELY_CPU_PROFILE"]; ok && v == "" {
			profile = ""
		}
		cmd := exec.Command(bin, "serve")
		cmd.Env = withVars(cleanEnviron(), all)
		wg.Add(1)
		go func() {
			defer wg.Done()
			procs[i], errs[i] = startProcess(ctx, "notifications serve #"+strconv.Itoa(i+1), cmd, addr, profile, startTimeout)
		}()
	}
	wg.Wait()
	for _, p := range procs {
		if p != nil {
			e.Cleanup(func(context.Context) error { return p.Stop(stopTimeout) })
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	procs[0].peers = procs[1:]
	return procs[0], nil
}

// spreadFirst is a System whose Start returns once the partitions'
// leases are spread over its processes (see waitSpread), and keeps when:
// the drain is timed from then (see fromSpread), so that the time the
// partitions take to change hands, a few seconds at the default lease,
// is left out. It has no latency phase (its paced producer would send
// events without subjectseq).
type spreadFirst struct {
	System
	env       *Env
	db        *sqlx.DB
	processes int
	// spread is when the partitions were found spread.
	spread time.Time
}

// Start starts the processes and waits until the partitions are spread
// over them.
func (s *spreadFirst) Start(ctx context.Context) (*Process, error) {
	p, err := s.System.Start(ctx)
	if err != nil {
		return nil, err
	}
	began := time.Now()
	if err := waitSpread(ctx, s.db, p, s.processes); err != nil {
		return nil, err
	}
	s.spread = time.Now()
	s.env.Logf("partitions spread over %d processes %s after they were ready", s.processes, s.spread.Sub(began).Round(10*time.Millisecond))
	return p, nil
}

// fromSpread times res's drain from when the partitions were spread to
// the last effect, over the effects written from then on; it leaves res
// as it is when fewer than two were (a smoke run's).
func (s *spreadFirst) fromSpread(ctx context.Context, res *Result) error {
	effects, err := s.Effects().Read(ctx)
	if err != nil {
		return err
	}
	var last time.Time
	n := 0
	for _, e := range effects {
		if !e.At.Before(s.spread) {
			n++
			if e.At.After(last) {
				last = e.At
			}
		}
	}
	s.env.Logf("%d of %d effects once the partitions were spread", n, len(effects))
	if n < 2 {
		res.Note = fmt.Sprintf("drained before the partitions were spread (%d effects after): timed over the whole drain", n)
		return nil
	}
	res.Drained, res.Elapsed = n, last.Sub(s.spread)
	return nil
}

// spreadTimeout is how long waitSpread waits: several leases.
const spreadTimeout = 90 * time.Second

// waitSpread waits until the ScaleOutPartitions leases of the partitioned
// consumer (partition_leases, in the stores' database db) are held, by as
// many owners as there are processes (at most one a partition), none
// holding more than its share.
func waitSpread(ctx context.Context, db *sqlx.DB, p *Process, processes int) error {
	owners := min(max(1, processes), ScaleOutPartitions)
	share := (ScaleOutPartitions + owners - 1) / owners
	deadline := time.Now().Add(spreadTimeout)
	for {
		var held []int
		err := db.SelectContext(ctx, &held, `SELECT count(*) FROM partition_leases WHERE consumer = $1 AND owner <> '' AND expires_at > now() GROUP BY owner`, serviceQueue)
		if err != nil {
			return fmt.Errorf("read the partitions' leases: %w", err)
		}
		total, most := 0, 0
		for _, n := range held {
			total, most = total+n, max(most, n)
		}
		if len(held) == owners && total == ScaleOutPartitions && most <= share {
			return nil
		}
		if err := p.Exited(); err != nil {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("partitions not spread over %d processes after %s: %v held by each owner", owners, spreadTimeout, held)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
