package main

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/internal/crash"
)

// partTransports are the transports that partition a consumer, by the
// names of their subtests.
var partTransports = []struct{ name, transport string }{
	{"Postgres", app.TransportPostgres},
	{"AMQP", app.TransportAMQP},
}

// onEachTransport runs test on each transport of partTransports, in
// parallel.
func onEachTransport(t *testing.T, test func(t *testing.T, transport string)) {
	t.Helper()
	for _, tr := range partTransports {
		t.Run(tr.name, func(t *testing.T) {
			t.Parallel()
			test(t, tr.transport)
		})
	}
}

// partDefaultTimeout is the consumer's timeout, unless a test needs
// another: longer than every freeze, so that an attempt frozen in its
// transaction is still alive, its session too, when its process goes on.
const partDefaultTimeout = 30 * time.Second

// TestPartitionsKill runs three processes and kills one with SIGKILL
// mid-run: the others take its partitions once its leases expire, and
// handle them; every event takes effect once, in order, with no dead
// letter.
func TestPartitionsKill(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	onEachTransport(t, func(t *testing.T, transport string) {
		s := newPartSetup(t, transport, partMaxDeliveries, partDefaultTimeout)
		a, b, c := s.start(t), s.start(t), s.start(t)
		s.waitBalanced(t, a, b, c)
		const rounds = 50
		f := s.feed(t, rounds, partEvery)
		s.waitEffects(t, rounds*partSubjects/3, a, b, c)

		lost := s.heldBy(t, a, a, b, c) // the victim's
		killed := time.Now()
		a.kill(t)
		s.waitFor(t, "the killed process's partitions taken by the others", s.ownedByOthers(t, lost, a), b, c)
		took := time.Since(killed)
		s.waitFor(t, "effects of its partitions by the others", func() bool {
			return s.effectsByOthers(t, lost, a.pid, killed) > 0
		}, b, c)
		handled := time.Since(killed)
		t.Logf("partitions %v of the killed process: taken by the others after %s, handled after %s (lease %s)", lost, took, handled, partLease)
		require.Less(t, took, partTakeover, "the others took the partitions after their lease")
		require.Less(t, handled, partTakeover+5*time.Second, "the others handled the partitions")

		s.waitBalanced(t, b, c)
		s.drain(t, f.wait(t), b, c)
	})
}

// TestPartitionsAddAndStop starts two processes, adds a third mid-run,
// then stops one gracefully (SIGTERM): every event takes effect once, in
// order, with no dead letter.
func TestPartitionsAddAndStop(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	onEachTransport(t, func(t *testing.T, transport string) {
		s := newPartSetup(t, transport, partMaxDeliveries, partDefaultTimeout)
		a, b := s.start(t), s.start(t)
		s.waitBalanced(t, a, b)
		const rounds = 60
		f := s.feed(t, rounds, partEvery)
		s.waitEffects(t, rounds*partSubjects/6, a, b)

		c := s.start(t)
		s.waitBalanced(t, a, b, c)
		s.waitEffects(t, rounds*partSubjects/2, a, b, c)
		a.stop(t)
		s.waitBalanced(t, b, c)
		s.drain(t, f.wait(t), b, c)
	})
}

// partFreeze is how long the frozen processes stay stopped: past their
// lease.
const partFreeze = 8 * time.Second

// TestPartitionsFreeze stops a process (SIGSTOP) in a delivery's
// transaction, its handler's writes done and its partition's lease not
// checked yet, and keeps it stopped past its lease: the others take its
// partitions, ending its database sessions as they do (its transaction
// with them), and handle them while it is stopped; once it goes on
// (SIGCONT) its attempt fails on its ended connection, and the next
// fails the lease's check (the fence) and is handed back, so nothing it
// ran before the freeze commits after it; every event takes effect once,
// in order, with no dead letter.
func TestPartitionsFreeze(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	onEachTransport(t, func(t *testing.T, transport string) {
		s := newPartSetup(t, transport, partMaxDeliveries, partDefaultTimeout)
		s.frozenMidCommit(t, crash.BeforeCommit)
	})
}

// frozenMidCommit runs three processes, stops one at point of a
// delivery of its partitions until partFreeze passed, then lets it go
// on, and checks that every event took effect once, in order, and that
// nothing the stopped process began before it stopped committed after
// it went on.
func (s *partSetup) frozenMidCommit(t *testing.T, at testkit.CrashPoint) {
	t.Helper()
	a, b, c, f, held := s.armedThree(t, 60, 5, at, armStop)
	s.waitStopped(t, a, b, c)
	stoppedAt := time.Now()
	report, _ := a.fired()
	s.waitFor(t, "the stopped process's partitions taken by the others", s.ownedByOthers(t, held, a), b, c)
	took := time.Since(stoppedAt)
	time.Sleep(time.Until(stoppedAt.Add(partFreeze)))
	// What the stopped process committed before it stopped, and the
	// database's time while it is stopped.
	var before []int64
	require.NoError(t, s.db.SelectContext(t.Context(), &before, `SELECT n FROM order_effects WHERE pid = $1`, a.pid))
	var frozen time.Time
	require.NoError(t, s.db.GetContext(t.Context(), &frozen, `SELECT clock_timestamp()`))
	moved := s.effectsByOthers(t, held, a.pid, stoppedAt)
	t.Logf("process %d stopped at %s (%s): partitions %v taken by the others after %s; %d of their effects by the others while it was stopped",
		a.pid, at, report, held, took, moved)
	require.Less(t, took, partTakeover, "the others took the stopped process's partitions after their lease")
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	require.Positive(t, moved, "effects of the stopped process's partitions by their new owners while it was stopped")
	// It rejoins the group, its connections made again.
	s.waitBalanced(t, a, b, c)

	s.drain(t, f.wait(t), a, b, c)
	var late []string
	for _, e := range s.effects(t) {
		if e.PID == a.pid && e.At.Before(frozen) && !slices.Contains(before, e.N) {
			late = append(late, e.EventID)
		}
	}
	require.Empty(t, late, "effects the stopped process ran before it stopped and committed after it went on: past its leases")
	// The attempt it stopped in took effect once, by another process:
	// the stopped one's transaction was ended with its session by the
	// partition's new owner, or failed its fence once it went on.
	var fired armReport
	require.NoError(t, json.Unmarshal([]byte(report), &fired))
	var by []int
	require.NoError(t, s.db.SelectContext(t.Context(), &by, `SELECT pid FROM order_effects WHERE event_id = $1`, fired.Event))
	require.Len(t, by, 1, "the effects of %s, the event of the stopped attempt", fired.Event)
	require.NotEqual(t, a.pid, by[0], "the stopped attempt, of %s, committed after the process went on", fired.Event)
	requireSessionsEnded(t, a, b, c)
}

// requireSessionsEnded checks that a new owner of the partitions of
// stopped, frozen past its lease, ended its database sessions: one of
// others logged it, or stopped saw its connections ended (a loaded
// machine may end them after the new owner's time for it ran out).
func requireSessionsEnded(t *testing.T, stopped *partProc, others ...*partProc) {
	t.Helper()
	const (
		ended      = "ended the database sessions of the partition's stale owner" // the runner's partitioner
		terminated = "terminating connection due to administrator command (SQLSTATE 57P01)"
	)
	logs := ""
	for _, p := range others {
		logs += p.logText(t)
	}
	require.True(t, strings.Contains(logs, ended) || strings.Contains(stopped.logText(t), terminated),
		"a new owner of the stopped process's partitions ended its database sessions: %q in their logs, or %q in its", ended, terminated)
}

// TestPartitionsRebalancesLimitOne starts and stops processes one after
// another, six rebalances in all, while the events keep coming, at
// max_deliveries 1, the lowest limit: a message that a stopping process's
// intake refuses unhandled ("runner: stopping: message not handled"),
// that waits for its subject's turn when the process stops, or that a
// cancelled consumer's prefetch returns to its queue, comes to the next
// process flagged redelivered. The runner recorded it as costing nothing
// before it went back, so the guard counts it as the first delivery, not
// the second: no rebalance dead-letters a message (delivery_limit, no
// attempt), and every event takes effect once, in order. (The same run
// at max_deliveries 2 proved less: a rebalance charged once would pass
// there, and fail here.)
func TestPartitionsRebalancesLimitOne(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	onEachTransport(t, func(t *testing.T, transport string) {
		s := newPartSetup(t, transport, 1, partDefaultTimeout)
		s.rebalances(t)
	})
}

// rebalances runs two processes, then three times starts a third and
// stops the oldest gracefully, while the events keep coming: six
// rebalances.
func (s *partSetup) rebalances(t *testing.T) {
	t.Helper()
	live := []*partProc{s.start(t), s.start(t)}
	s.waitBalanced(t, live...)
	f := s.feed(t, 0, 250*time.Millisecond)
	for range 3 {
		live = append(live, s.start(t))
		s.waitBalanced(t, live...)
		live[0].stop(t)
		live = live[1:]
		s.waitBalanced(t, live...)
	}
	s.drain(t, f.end(t), live...)
}

// ownedByOthers returns a condition that holds once processes other
// than p own each of partitions.
func (s *partSetup) ownedByOthers(t *testing.T, partitions []int, p *partProc) func() bool {
	t.Helper()
	return func() bool {
		owners := s.owners(t)
		for _, part := range partitions {
			if pid, ok := owners[part]; !ok || pid == p.pid {
				return false
			}
		}
		return true
	}
}

// TestPartitionsCrash kills or stops processes at the crash points
// around a rebalance, on each transport (TestPartitionsFreeze stops one
// before its fence):
//
//   - FrozenAfterFence stops a process right after its batch checked its
//     partition's lease (on PostgreSQL the lease row is locked until the
//     batch's transaction ends), past its lease: the process that takes
//     a partition over ends the stopped one's sessions, and so its
//     transaction (else the server would, once its deadline passed:
//     idle_in_transaction_session_timeout), the others take the
//     partitions, and keep their own meanwhile;
//   - KilledAfterFence kills a process there: its transaction rolls
//     back with its connection, and the others take its partitions;
//   - NewOwnerKilledAfterCommit kills a process, then kills the process
//     that took one of its partitions right after its first commit
//     there, before the ack: the redelivery is a duplicate.
//
// Every event takes effect once, in order, with no dead letter.
func TestPartitionsCrash(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	t.Run("FrozenAfterFence", func(t *testing.T) {
		t.Parallel()
		onEachTransport(t, func(t *testing.T, transport string) {
			// A timeout shorter than the freeze, and longer than the
			// lease: were the stopped process's sessions not ended,
			// the others would wait for its transaction past their
			// leases, until the server ends it 2 s after its deadline.
			const timeout = 10 * time.Second
			s := newPartSetup(t, transport, partMaxDeliveries, timeout)
			s.frozenAfterFence(t, timeout+2*time.Second+partLease)
		})
	})
	t.Run("KilledAfterFence", func(t *testing.T) {
		t.Parallel()
		onEachTransport(t, func(t *testing.T, transport string) {
			s := newPartSetup(t, transport, partMaxDeliveries, partDefaultTimeout)
			s.killedAt(t, crash.AfterFence)
		})
	})
	t.Run("NewOwnerKilledAfterCommit", func(t *testing.T) {
		t.Parallel()
		onEachTransport(t, func(t *testing.T, transport string) {
			s := newPartSetup(t, transport, partMaxDeliveries, partDefaultTimeout)
			s.newOwnerKilled(t)
		})
	})
}

// frozenAfterFence runs three processes and stops one right after a
// batch of its partitions checked their leases, for freeze: the others
// must take its partitions once the server ended its transaction,
// without losing their own meanwhile.
func (s *partSetup) frozenAfterFence(t *testing.T, freeze time.Duration) {
	t.Helper()
	a, b, c, f, held := s.armedThree(t, 60, 5, crash.AfterFence, armStop)
	s.waitStopped(t, a, b, c)
	stoppedAt := time.Now()
	report, _ := a.fired()
	// Until the freeze ends: when the others took the stopped process's
	// partitions, and how long each of the others' partitions went
	// without an owner: a handover between them takes a second or so,
	// a lease lost to a take that waits for the stopped process longer.
	var (
		took    time.Duration
		unowned = map[int]time.Time{}
		longest = map[int]time.Duration{}
		// sessions is what the database's sessions were doing when one
		// of the others' partitions first went without an owner for a
		// lease: what a take waited for, reported if it fails.
		sessions string
	)
	for time.Since(stoppedAt) < freeze {
		owners := s.owners(t)
		if took == 0 && s.ownedByOthers(t, held, a)() {
			took = time.Since(stoppedAt)
		}
		for part := range partCount {
			_, owned := owners[part]
			switch {
			case slices.Contains(held, part):
			case owned:
				delete(unowned, part)
			case unowned[part].IsZero():
				unowned[part] = time.Now()
			default:
				longest[part] = max(longest[part], time.Since(unowned[part]))
				if sessions == "" && longest[part] >= partLease {
					sessions = s.sessions(t)
				}
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("process %d stopped at %s (%s): partitions %v taken by the others after %s; the others' partitions without an owner for at most %v",
		a.pid, crash.AfterFence, report, held, took, longest)
	require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
	for part, d := range longest {
		require.Less(t, d, partLease, "partition %d, not the stopped process's, went without an owner while the stopped process's transaction held its leases; the database's sessions then:\n%s", part, sessions)
	}
	require.NotZero(t, took, "the others took the stopped process's partitions while it was stopped")
	s.drain(t, f.wait(t), a, b, c)
}

// sessions returns, a line each, what the sessions of the database's
// server that are not idle are doing (state, wait, the sessions that
// block them, their transaction's age, their statement), for a report.
func (s *partSetup) sessions(t *testing.T) string {
	t.Helper()
	var rows []struct {
		Line string `db:"line"`
	}
	err := s.db.SelectContext(t.Context(), &rows, `SELECT format('%s pid %s %s wait %s/%s blocked by %s, transaction %s s: %s',
	application_name, pid, state, wait_event_type, wait_event, pg_blocking_pids(pid),
	round(extract(epoch FROM now() - xact_start)::numeric, 1), left(query, 160)) AS line
FROM pg_stat_activity WHERE state <> 'idle' AND pid <> pg_backend_pid() AND backend_type = 'client backend' ORDER BY application_name, pid`)
	if err != nil {
		return "(could not read them: " + err.Error() + ")"
	}
	lines := make([]string, len(rows))
	for i, r := range rows {
		lines[i] = r.Line
	}
	return strings.Join(lines, "\n")
}

// killedAt runs three processes and kills one at point of a delivery of
// its partitions: the others take them.
func (s *partSetup) killedAt(t *testing.T, at testkit.CrashPoint) {
	t.Helper()
	a, b, c, f, held := s.armedThree(t, 50, 4, at, armKill)
	a.waitKilled(t)
	killed := time.Now()
	report, _ := a.fired()
	s.waitFor(t, "the killed process's partitions taken by the others", s.ownedByOthers(t, held, a), b, c)
	took := time.Since(killed)
	t.Logf("process %d killed at %s (%s): partitions %v taken by the others after %s", a.pid, at, report, held, took)
	require.Less(t, took, partTakeover, "the others took the partitions after their lease")
	s.waitBalanced(t, b, c)
	s.drain(t, f.wait(t), b, c)
}

// newOwnerKilled runs three processes, kills one, and kills the process
// that first commits an effect of its partitions right after that
// commit: a fourth joins, and every event takes effect once.
func (s *partSetup) newOwnerKilled(t *testing.T) {
	t.Helper()
	a, b, c := s.start(t), s.start(t), s.start(t)
	s.waitBalanced(t, a, b, c)
	const rounds = 50
	f := s.feed(t, rounds, partEvery)
	s.waitEffects(t, rounds*partSubjects/4, a, b, c)

	held := s.heldBy(t, a, a, b, c) // the partitions of the process to kill
	// Once a is gone, partition p falls to the member p mod 2 of b and
	// c, sorted by name: the new owner of a's first partition is armed.
	members := s.members(t)
	killed, alive := b, c
	if (members[b.pid] < members[c.pid]) != (held[0]%2 == 0) {
		killed, alive = c, b
	}
	killed.armWith(t, crash.AfterCommit, armKill, held[:1])
	a.kill(t)
	killed.waitKilled(t)
	report, _ := killed.fired()
	d := s.start(t)
	s.waitBalanced(t, alive, d)
	s.drain(t, f.wait(t), alive, d)
	t.Logf("process %d, a new owner of partitions %v, killed after its first commit there: %s", killed.pid, held, report)
	// Its first commit there may be its own effect, or the mark of a
	// duplicate (an event a took effect of, after its partition's last
	// acknowledged position): either way, once.
	var fired armReport
	require.NoError(t, json.Unmarshal([]byte(report), &fired))
	require.Equal(t, 1, count(s.db, `SELECT count(*) FROM order_effects WHERE event_id = $1`, fired.Event),
		"the effect of the event the killed new owner committed before its ack")
}

// TestPartitionsFrozenHandover stops a process (SIGSTOP) in a delivery's
// transaction for 15 s, five times its lease and past the server's end of
// that transaction (the consumer's timeout is 4 s): the others take its
// leases and handle its partitions while it is stopped. On PostgreSQL
// the stopped process's sessions hold the partition (its transaction's
// locks; on the PostgreSQL transport, its subscription's advisory lock
// of the partition), until the process that takes the partition over
// ends them (driver.SessionEnder); on RabbitMQ the stopped process is
// the partition's queue's single active consumer until the broker drops
// its connection, two heartbeats (a third of the lease each) after it
// stopped.
func TestPartitionsFrozenHandover(t *testing.T) {
	// Not parallel with the package's other tests: its processes load
	// the two cores enough, and its bounds are the lease's.
	onEachTransport(t, func(t *testing.T, transport string) {
		s := newPartSetup(t, transport, partMaxDeliveries, 4*time.Second)
		a, b, c, f, held := s.armedThree(t, 60, 5, crash.BeforeCommit, armStop)
		s.waitStopped(t, a, b, c)
		stoppedAt := time.Now()
		s.waitFor(t, "the stopped process's partitions taken by the others", s.ownedByOthers(t, held, a), b, c)
		took := time.Since(stoppedAt)
		s.waitFor(t, "effects of its partitions by the others", func() bool {
			return s.effectsByOthers(t, held, a.pid, stoppedAt) > 0
		}, b, c)
		handled := time.Since(stoppedAt)
		time.Sleep(time.Until(stoppedAt.Add(15 * time.Second)))
		moved := s.effectsByOthers(t, held, a.pid, stoppedAt)
		require.NoError(t, a.cmd.Process.Signal(syscall.SIGCONT))
		t.Logf("partitions %v of the stopped process: taken by the others after %s, handled after %s, %d effects there while it was stopped (lease %s)",
			held, took, handled, moved, partLease)
		require.Less(t, took, partTakeover, "the others took the stopped process's partitions after their lease")
		require.Less(t, handled, partTakeover+5*time.Second, "the others handled the stopped process's partitions")
		s.waitBalanced(t, a, b, c) // it rejoins the group
		s.drain(t, f.wait(t), a, b, c)
		requireSessionsEnded(t, a, b, c)
	})
}

// armedThree runs three processes, feeds them rounds rounds of events,
// waits until the first's partitions are a share-th through theirs, and
// arms it at point at of a delivery of its partitions, to action it
// (armStop, armKill). It returns the processes, the feed and the
// partitions of the armed one.
//
// The armed process then has most of its partitions' events still to
// handle, whichever partitions it holds and however far behind the feed
// the others are. (Armed at a share-th of all the effects instead, a
// process that holds one partition of few subjects can have handled all
// of its events by then, when the others lag on a loaded machine: it
// never reaches its point. A fresh-clone make test once waited for it
// in vain so, the armed process the owner of one partition.)
func (s *partSetup) armedThree(t *testing.T, rounds, share int, at testkit.CrashPoint, action string) (a, b, c *partProc, f *feed, held []int) {
	t.Helper()
	a, b, c = s.start(t), s.start(t), s.start(t)
	s.waitBalanced(t, a, b, c)
	held = s.heldBy(t, a, a, b, c) // the partitions of the process to arm
	f = s.feed(t, rounds, partEvery)
	s.waitFor(t, fmt.Sprintf("effect of round %d in partitions %v", rounds/share, held), func() bool {
		return s.roundIn(held) >= rounds/share
	}, a, b, c)
	a.armWith(t, at, action, held)
	return a, b, c, f, held
}

// roundIn returns the latest round (an event's seq) that took effect in
// partitions; 0 when none, -1 when it cannot tell.
func (s *partSetup) roundIn(partitions []int) int {
	parts := make([]int64, len(partitions))
	for i, p := range partitions {
		parts[i] = int64(p)
	}
	return count(s.db, `SELECT coalesce(max(seq), 0) FROM order_effects WHERE subject LIKE $1 || '-%' AND partition = ANY($2)`, s.prefix, parts)
}

// waitStopped waits until a's hook stopped it (armStop), while others
// go on.
func (s *partSetup) waitStopped(t *testing.T, a *partProc, others ...*partProc) {
	t.Helper()
	s.waitFor(t, "the process stopped by its hook", func() bool {
		_, ok := a.fired()
		return ok && a.stopped()
	}, others...)
}
