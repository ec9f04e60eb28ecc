package main

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/internal/testenv"
)

// The partition tests run the service as several processes of one
// partitioned strict_order consumer (partitions_cases_test.go), on the
// PostgreSQL transport and on RabbitMQ with the stores in PostgreSQL,
// while the test publishes the events of a few busy subjects in
// sequence; they kill, add, stop and freeze processes mid-run, and check
// that every event took effect exactly once, after its predecessor, with
// nothing dead-lettered or parked (see partSetup.check). The handler
// (newOrderedRemind) records each effect with the process that committed
// it.

// The partition tests' consumer.
const (
	partCount    = 4
	partSubjects = 20
	// partLease is the consumer's partition_lease: a process that dies
	// or freezes keeps its partitions that long.
	partLease = 3 * time.Second
	// partStep is how often a process renews its leases: a fifth of
	// partLease.
	partStep = partLease / 5
	// partTakeover bounds the time the others take to hold the
	// partitions of a process that died or froze: its lease, a step, and
	// room for a loaded machine.
	partTakeover = partLease + partStep + 7*time.Second
	// partEvery is the pause between two rounds of the feed, unless a
	// test feeds for long.
	partEvery = 100 * time.Millisecond
)

// partConfig is the service's configuration: partition_lease, the
// consumer's max_deliveries and timeout. A low max_deliveries makes a
// handover that charged the deliveries it cut short show as dead
// letters.
const partConfig = `partition_lease: %s
defaults:
  partitions: 4
  concurrency: 8
  strict_order: true
  max_deliveries: %d
  attempts: 3
  retry_delay: 50ms
  timeout: %s
`

// partMaxDeliveries is the consumer's max_deliveries unless a test sets
// another: a message in flight in a process that is killed comes again,
// a counted redelivery.
const partMaxDeliveries = 3

// partSetup is one partition test: the consumer, the database and the
// broker its processes share, and how the test publishes.
type partSetup struct {
	transport string
	dir       string
	consumer  string
	prefix    string // of the test's event ids and subjects
	db        *sqlx.DB
	leases    driver.Leases
	env       []string
	// publish publishes msgs, as another process would.
	publish func(ctx context.Context, msgs []*message.Message) error
	// pending counts the consumer's messages not acknowledged (on AMQP,
	// those ready in its partitions' queues); -1 when it cannot tell.
	pending func(t *testing.T) int

	mu    sync.Mutex
	procs int // started, to name their arm files
}

// partProc is one process of the service.
type partProc struct {
	*service
	pid int
	// arm is the file that arms its hook (see modeArmed).
	arm string
	log string
}

// newPartSetup returns the set-up of the test on transport, with the
// consumer's max_deliveries and timeout.
func newPartSetup(t *testing.T, transport string, maxDeliveries int, timeout time.Duration) *partSetup {
	t.Helper()
	dir := t.TempDir()
	id := strconv.FormatInt(time.Now().UnixNano(), 36)
	name := strings.ToLower(strings.NewReplacer("/", "-", "_", "-").Replace(t.Name()))
	s := &partSetup{
		transport: transport,
		dir:       dir,
		consumer:  "notifications.part-" + id,
		prefix:    name + "-" + id,
	}
	configPath := filepath.Join(dir, "effectively.yaml")
	require.NoError(t, os.WriteFile(configPath, []byte(fmt.Sprintf(partConfig, partLease, maxDeliveries, timeout)), 0o600))
	url := testenv.PostgresURL(t)
	s.db = openPostgres(t, url)
	_, err := s.db.ExecContext(t.Context(), orderEffectsTable)
	require.NoError(t, err)
	store, err := postgres.NewStore(s.db, postgres.StoreConfig{})
	require.NoError(t, err)
	s.leases = store
	s.env = []string{
		envCrashConsumer + "=" + s.consumer,
		envOrderCheck + "=1",
		app.EnvTablePrefix + "=",
		app.EnvAutoMigrate + "=true",
		app.EnvHTTPAddr + "=",
		app.EnvConfig + "=" + configPath,
		app.EnvDatabaseURL + "=" + url,
		app.EnvTransportURL + "=",
		app.EnvTransport + "=" + transport,
	}
	switch transport {
	case app.TransportPostgres:
		s.postgresTransport(t)
	case app.TransportAMQP:
		s.amqpTransport(t)
	default:
		t.Fatalf("transport %s: the partition tests run on postgres and amqp", transport)
	}
	return s
}

// postgresTransport publishes to the SQL transport's table of the type.
func (s *partSetup) postgresTransport(t *testing.T) {
	t.Helper()
	tr, err := postgres.New(t.Context(), s.db, postgres.TransportConfig{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	s.publish = func(_ context.Context, msgs []*message.Message) error {
		return tr.Publisher().Publish(appointments.Booked.Type(), msgs...)
	}
	topic := appointments.Booked.Type()
	// A message waits while its partition's position is before it, or
	// while its partition has none.
	query := fmt.Sprintf(`SELECT count(*) FROM %s m WHERE ((m.transaction_id, m."offset") > (
		SELECT o.last_processed_transaction_id, COALESCE(o.offset_acked, 0) FROM %s o
		WHERE o.consumer_group = $1 || '#' || (COALESCE(m.bucket, effectively_bucket(m.payload::text)) %% %d) || '/%d')) IS NOT FALSE`,
		postgres.MessagesTable("", topic), postgres.OffsetsTable("", topic), partCount, partCount)
	s.pending = func(*testing.T) int { return count(s.db, query, s.consumer) }
}

// amqpTransport publishes to the consumer's consistent-hash exchange,
// which the service declares (amqp.Transport.Replay), so that no other
// consumer of the shared broker gets the test's messages; the exchange
// and the partitions' queues are deleted when the test ends.
func (s *partSetup) amqpTransport(t *testing.T) {
	t.Helper()
	url := testenv.Require(t, testenv.AMQPURLVar)
	s.env = append(s.env, app.EnvAMQPURL+"="+url)
	tr, err := amqp.New(amqp.TransportConfig{URL: url})
	require.NoError(t, err)
	require.NoError(t, tr.Connect(t.Context()))
	t.Cleanup(func() { _ = tr.Close() })
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	queues := make([]string, partCount)
	for i := range queues {
		queues[i] = fmt.Sprintf("%s.p%02d", s.consumer, i)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			t.Logf("delete the queues of %s: %v", s.consumer, err)
			return
		}
		defer ch.Close()
		for _, q := range queues {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Logf("delete queue %s: %v", q, err)
				return // the broker closed the channel
			}
		}
		if err := ch.ExchangeDelete(s.consumer+".partitions", false, false); err != nil {
			t.Logf("delete exchange %s.partitions: %v", s.consumer, err)
		}
	})
	s.publish = func(ctx context.Context, msgs []*message.Message) error {
		return tr.Replay(ctx, s.consumer, msgs...)
	}
	s.pending = func(*testing.T) int {
		ch, err := conn.Channel()
		if err != nil {
			return -1
		}
		defer ch.Close()
		n := 0
		for _, q := range queues {
			st, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
			if err != nil {
				return -1 // not declared yet; the broker closed the channel
			}
			n += st.Messages
		}
		return n
	}
}

// start starts a process of the service, its hook unarmed, and waits
// until it runs.
func (s *partSetup) start(t *testing.T) *partProc {
	t.Helper()
	s.mu.Lock()
	s.procs++
	arm := filepath.Join(s.dir, fmt.Sprintf("arm-%d", s.procs))
	s.mu.Unlock()
	svc := startService(t, s.dir, modeArmed, append([]string{envArm + "=" + arm}, s.env...)...)
	p := &partProc{service: svc, pid: svc.cmd.Process.Pid, arm: arm, log: strings.TrimSuffix(svc.ready, ".ready") + ".log"}
	svc.waitFor(t, "the service to start", func() bool {
		_, err := os.Stat(svc.ready)
		return err == nil
	})
	return p
}

// kill kills the process with SIGKILL and waits for its end.
func (p *partProc) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, p.cmd.Process.Signal(syscall.SIGKILL))
	p.waitKilled(t)
}

// armWith arms the process's hook (see modeArmed): it does action at
// point at, in the first delivery of partitions that gets there.
func (p *partProc) armWith(t *testing.T, at testkit.CrashPoint, action string, partitions []int) {
	t.Helper()
	raw, err := json.Marshal(armOrder{At: at, Action: action, Partitions: partitions})
	require.NoError(t, err)
	require.NoError(t, writeWhole(p.arm, raw))
}

// fired returns the report of the process's hook, once it fired.
func (p *partProc) fired() (string, bool) {
	raw, err := os.ReadFile(armFired(p.arm))
	return string(raw), err == nil
}

// stopped reports whether the process is stopped (SIGSTOP): its state in
// /proc is T.
func (p *partProc) stopped() bool {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid))
	if err != nil {
		return false
	}
	// pid (comm) state ...: comm may hold spaces, never ") ".
	_, rest, ok := strings.Cut(string(raw), ") ")
	return ok && strings.HasPrefix(rest, "T")
}

// logText returns what the process logged so far.
func (p *partProc) logText(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(p.log)
	require.NoError(t, err)
	return string(raw)
}

// owners returns the process id of the live owner of each partition
// that has one.
func (s *partSetup) owners(t *testing.T) map[int]int {
	t.Helper()
	ls, err := s.leases.PartitionLeases(t.Context(), s.consumer)
	require.NoError(t, err)
	owners := map[int]int{}
	for _, l := range ls {
		if l.Owner == "" || !l.Expires.After(time.Now()) { // the database's clock is this machine's
			continue
		}
		// A member is host-pid-random (runner.NewMember).
		f := strings.Split(l.Owner, "-")
		require.GreaterOrEqual(t, len(f), 3, "member %s", l.Owner)
		pid, err := strconv.Atoi(f[len(f)-2])
		require.NoError(t, err, "member %s", l.Owner)
		owners[l.Partition] = pid
	}
	return owners
}

// members returns the member name of each live owner of a partition,
// by process id.
func (s *partSetup) members(t *testing.T) map[int]string {
	t.Helper()
	ls, err := s.leases.PartitionLeases(t.Context(), s.consumer)
	require.NoError(t, err)
	owners := s.owners(t)
	members := map[int]string{}
	for _, l := range ls {
		if pid, ok := owners[l.Partition]; ok && strings.Contains(l.Owner, "-"+strconv.Itoa(pid)+"-") {
			members[pid] = l.Owner
		}
	}
	return members
}

// partitionsOf returns the partitions p owns, sorted.
func (s *partSetup) partitionsOf(t *testing.T, p *partProc) []int {
	t.Helper()
	var parts []int
	for part, pid := range s.owners(t) {
		if pid == p.pid {
			parts = append(parts, part)
		}
	}
	slices.Sort(parts)
	return parts
}

// heldBy waits until p owns a partition, and returns those it owns: a
// process on a loaded machine may miss a renewal and own none for a
// moment. procs must stay up meanwhile.
func (s *partSetup) heldBy(t *testing.T, p *partProc, procs ...*partProc) []int {
	t.Helper()
	var held []int
	s.waitFor(t, fmt.Sprintf("partitions owned by process %d", p.pid), func() bool {
		held = s.partitionsOf(t, p)
		return len(held) > 0
	}, procs...)
	return held
}

// balanced reports whether procs, and no other process, own every
// partition, their shares differing by one at most.
func (s *partSetup) balanced(t *testing.T, procs ...*partProc) bool {
	t.Helper()
	owners := s.owners(t)
	if len(owners) != partCount {
		return false
	}
	held := map[int]int{}
	for _, p := range procs {
		held[p.pid] = 0
	}
	for _, pid := range owners {
		if _, ok := held[pid]; !ok {
			return false
		}
		held[pid]++
	}
	shares := slices.Sorted(maps.Values(held))
	return shares[0] >= partCount/len(procs) && shares[len(shares)-1] <= (partCount+len(procs)-1)/len(procs)
}

// waitBalanced waits until procs share the partitions (see balanced).
func (s *partSetup) waitBalanced(t *testing.T, procs ...*partProc) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("the partitions shared by %d processes", len(procs)), func() bool { return s.balanced(t, procs...) }, procs...)
}

// waitFor polls cond until it holds, within waitLimit; procs must stay
// up meanwhile.
func (s *partSetup) waitFor(t *testing.T, what string, cond func() bool, procs ...*partProc) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !cond() {
		for _, p := range procs {
			select {
			case <-p.done:
				t.Fatalf("service pid %d exited (%v) while waiting for %s", p.pid, p.err, what)
			default:
			}
		}
		if time.Now().After(deadline) {
			s.logSessions(t)
			s.logEffects(t)
			t.Fatalf("no %s within %s (owners %v)", what, waitLimit, s.owners(t))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// logSessions logs the sessions of the database that are in a
// transaction or waiting, with whom they wait for: what holds up a
// drain that did not end.
func (s *partSetup) logSessions(t *testing.T) {
	t.Helper()
	var sessions []struct {
		PID       int    `db:"pid"`
		App       string `db:"application_name"`
		State     string `db:"state"`
		Wait      string `db:"wait"`
		BlockedBy string `db:"blocked_by"`
		XactAge   string `db:"xact_age"`
		Query     string `db:"query"`
	}
	if err := s.db.Select(&sessions, `SELECT pid, application_name, state, coalesce(wait_event_type || ':' || wait_event, '') AS wait,
		pg_blocking_pids(pid)::text AS blocked_by, coalesce(now() - xact_start, '0')::text AS xact_age, left(query, 200) AS query
		FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()
		AND (state <> 'idle' OR cardinality(pg_blocking_pids(pid)) > 0) ORDER BY xact_start`); err != nil {
		t.Logf("sessions: %v", err)
	}
	for _, r := range sessions {
		t.Logf("session %d (%s): %s %s blocked by %s, transaction %s: %s", r.PID, r.App, r.State, r.Wait, r.BlockedBy, r.XactAge, r.Query)
	}
}

// logEffects logs, for each partition and process, how many effects it
// committed and when its last one was: which partitions a wait that did
// not end saw handled, and by whom.
func (s *partSetup) logEffects(t *testing.T) {
	t.Helper()
	var effects []struct {
		Partition int    `db:"partition"`
		PID       int    `db:"pid"`
		N         int    `db:"n"`
		First     string `db:"first"`
		Last      string `db:"last"`
	}
	if err := s.db.Select(&effects, `SELECT partition, pid, count(*) AS n, min(at)::text AS first, max(at)::text AS last
		FROM order_effects GROUP BY partition, pid ORDER BY partition, min(at)`); err != nil {
		t.Logf("effects: %v", err)
	}
	for _, r := range effects {
		t.Logf("effects of partition %d by pid %d: %d, from %s to %s", r.Partition, r.PID, r.N, r.First, r.Last)
	}
}

// feed is the test's publisher: rounds of events, one per subject each,
// each subject's numbered from 1.
type feed struct {
	stop   chan struct{}
	once   sync.Once
	done   chan struct{}
	rounds int   // published, set before done closes
	err    error // the publisher's, set before done closes
}

// feed publishes a round every every until rounds were published, or
// until the feed is ended (end) when rounds is 0. A round is published
// whole: an end waits for the round being published.
func (s *partSetup) feed(t *testing.T, rounds int, every time.Duration) *feed {
	t.Helper()
	f := &feed{stop: make(chan struct{}), done: make(chan struct{})}
	t.Cleanup(func() {
		f.once.Do(func() { close(f.stop) })
		<-f.done
	})
	go func() {
		defer close(f.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		ctx, cancel := context.WithTimeout(context.Background(), 2*waitLimit)
		defer cancel()
		for seq := 1; rounds == 0 || seq <= rounds; seq++ {
			msgs, err := s.round(seq)
			if err == nil {
				err = s.publish(ctx, msgs)
			}
			if err != nil {
				f.err = fmt.Errorf("round %d: %w", seq, err)
				return
			}
			f.rounds = seq
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return f
}

// end stops the feed after the round being published, and returns the
// number of rounds published.
func (f *feed) end(t *testing.T) int {
	t.Helper()
	f.once.Do(func() { close(f.stop) })
	return f.wait(t)
}

// wait waits until the feed ended, and returns the number of rounds it
// published.
func (f *feed) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-f.done:
	case <-time.After(waitLimit):
		t.Fatalf("the feed did not end within %s", waitLimit)
	}
	require.NoError(t, f.err, "the feed")
	return f.rounds
}

// round returns the events of round seq: the seq-th booking of each
// subject.
func (s *partSetup) round(seq int) ([]*message.Message, error) {
	msgs := make([]*message.Message, partSubjects)
	for i := range msgs {
		id := fmt.Sprintf("%s-s%02d-%04d", s.prefix, i, seq)
		env, err := appointments.Booked.Envelope(
			appointments.BookedV1{AppointmentID: "appt-" + id, StartsAt: time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)},
			framework.Attributes{ID: id, Source: appointments.Source, Subject: fmt.Sprintf("%s-s%02d", s.prefix, i), SubjectSeq: int64(seq)},
		)
		if err != nil {
			return nil, err
		}
		if msgs[i], err = framework.NewMessage(env); err != nil {
			return nil, err
		}
	}
	return msgs, nil
}

// partEffect is a row of order_effects.
type partEffect struct {
	N         int64     `db:"n"`
	EventID   string    `db:"event_id"`
	Subject   string    `db:"subject"`
	Seq       int64     `db:"seq"`
	Partition int       `db:"partition"`
	PID       int       `db:"pid"`
	PrevSeen  bool      `db:"prev_seen"`
	At        time.Time `db:"at"`
}

// effects returns the test's effects, in the order of their inserts.
func (s *partSetup) effects(t *testing.T) []partEffect {
	t.Helper()
	var rows []partEffect
	require.NoError(t, s.db.SelectContext(t.Context(), &rows, `SELECT n, event_id, subject, seq, partition, pid, prev_seen, at FROM order_effects WHERE subject LIKE $1 || '-%' ORDER BY n`, s.prefix))
	return rows
}

// effectCount counts the test's effects; -1 when it cannot.
func (s *partSetup) effectCount() int {
	return count(s.db, `SELECT count(*) FROM order_effects WHERE subject LIKE $1 || '-%'`, s.prefix)
}

// waitEffects waits for n effects; procs must stay up meanwhile.
func (s *partSetup) waitEffects(t *testing.T, n int, procs ...*partProc) {
	t.Helper()
	s.waitFor(t, fmt.Sprintf("%d effects", n), func() bool { return s.effectCount() >= n }, procs...)
}

// drain waits until the rounds' events all took effect and no message
// waits, with procs up, then checks them (see check).
func (s *partSetup) drain(t *testing.T, rounds int, procs ...*partProc) {
	t.Helper()
	n := rounds * partSubjects
	s.waitFor(t, fmt.Sprintf("%d effects and no message waiting", n), func() bool {
		return s.effectCount() >= n && s.pending(t) == 0
	}, procs...)
	s.check(t, rounds)
}

// check checks that each event of the rounds took effect exactly once,
// after its predecessor (its handler saw the predecessor's effect, and
// its insert came after it), with no dead letter, no parked event and
// one processed mark and reminder each.
func (s *partSetup) check(t *testing.T, rounds int) {
	t.Helper()
	effects := s.effects(t)
	seen := map[string]int{}
	last := map[string]int64{}
	var unordered []string
	for _, e := range effects {
		seen[e.EventID]++
		if !e.PrevSeen {
			unordered = append(unordered, fmt.Sprintf("%s ran before #%d took effect (pid %d)", e.EventID, e.Seq-1, e.PID))
		}
		if e.Seq != last[e.Subject]+1 {
			unordered = append(unordered, fmt.Sprintf("%s took effect after #%d", e.EventID, last[e.Subject]))
		}
		last[e.Subject] = e.Seq
	}
	var twice, missing []string
	for i := range partSubjects {
		for seq := 1; seq <= rounds; seq++ {
			id := fmt.Sprintf("%s-s%02d-%04d", s.prefix, i, seq)
			switch seen[id] {
			case 0:
				missing = append(missing, id)
			case 1:
			default:
				twice = append(twice, id)
			}
		}
	}
	require.Empty(t, missing, "events without effect")
	require.Empty(t, twice, "events that took effect twice")
	require.Len(t, effects, rounds*partSubjects, "effects")
	require.Empty(t, unordered, "events that took effect out of order")
	like := s.prefix + "-%"
	require.Equal(t, rounds*partSubjects, count(s.db, `SELECT count(DISTINCT event_id) FROM reminders WHERE event_id LIKE $1`, like), "reminders")
	require.Equal(t, rounds*partSubjects, count(s.db, `SELECT count(*) FROM reminders WHERE event_id LIKE $1`, like), "reminders, once each")
	require.Equal(t, rounds*partSubjects, count(s.db, `SELECT count(*) FROM processed_events WHERE consumer = $1 AND event_id LIKE $2`, s.consumer, like), "processed marks")
	var dead []string
	require.NoError(t, s.db.SelectContext(t.Context(), &dead, `SELECT event_id || ' ' || code FROM dead_letters WHERE consumer = $1`, s.consumer))
	require.Empty(t, dead, "dead letters")
	require.Zero(t, count(s.db, `SELECT count(*) FROM parked_events WHERE consumer = $1`, s.consumer), "parked events")
}

// effectsByOthers counts the effects of partitions committed by
// processes other than pid, inserted at or after since.
func (s *partSetup) effectsByOthers(t *testing.T, partitions []int, pid int, since time.Time) int {
	t.Helper()
	n := 0
	for _, e := range s.effects(t) {
		if e.PID != pid && slices.Contains(partitions, e.Partition) && !e.At.Before(since) {
			n++
		}
	}
	return n
}
