package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// partitioner holds this process's share of a partitioned consumer's
// partitions: it keeps the process a live member of the consumer's group
// (driver.Leases.Heartbeat), takes the leases of the partitions that fall
// to it among the live members, hands back those that no longer do, and
// tells the subscription which to consume (driver.Assigner). It is the
// consumer's driver.Fencer: an attempt commits only while the process
// holds its partition's lease with the token it was given.
//
// The partitions fall to the live members, sorted, in turn: partition p
// to the member p mod m of m, so every member holds the same number of
// partitions, give or take one. A partition changes hands in steps: its
// owner stops consuming it, waits for its messages handed out to settle,
// and frees its lease; the member it falls to then takes the lease (with
// a new token) and consumes it. A member that dies keeps its leases until
// they expire, Lease after its last renewal.
type partitioner struct {
	consumer   string
	partitions int
	member     string
	leases     driver.Leases
	// ender, when the store can, ends the sessions of a partition's
	// stale owner before the partitioner takes the partition (see
	// endStale); nil otherwise.
	ender    driver.SessionEnder
	assigner driver.Assigner
	lease    time.Duration
	logger   *slog.Logger
	// stop is closed when the runner begins to stop: from then on the
	// partitioner takes no partition, only renews those it holds.
	stop <-chan struct{}

	mu sync.Mutex
	// held are the partitions the subscription consumes, with the tokens
	// of their leases.
	held map[int]int64
	// assigned are the partitions the subscription was last assigned,
	// sorted, when assignedOK: not before the first Assign, nor after a
	// failed one.
	assigned   []int
	assignedOK bool
}

// maxMemberHost is the most bytes of the host's name in a member's name
// (NewMember), so that the name fits in an application_name
// (postgres.MaxApplicationName) with the process id and the random part.
const maxMemberHost = 40

// NewMember returns a new name for a process in its partitioned
// consumers' groups (Config.Member): its host (cut to 40 bytes) and
// process id, and random bytes, since a process id is reused. It is
// printable ASCII, at most 60 bytes, so that it fits in an
// application_name.
func NewMember() string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "host"
	}
	host = strings.Map(func(r rune) rune {
		if r < 0x21 || r > 0x7e {
			return '_'
		}
		return r
	}, host)
	if len(host) > maxMemberHost {
		host = host[:maxMemberHost]
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%s-%d-%s", host, os.Getpid(), hex.EncodeToString(b))
}

// Fence checks in tx that the process holds each of partitions with the
// token of its lease (driver.Leases.Fence).
func (p *partitioner) Fence(ctx context.Context, tx *driver.Tx, partitions []int) error {
	p.mu.Lock()
	fences := make([]driver.Fence, 0, len(partitions))
	for _, part := range partitions {
		token, ok := p.held[part]
		if !ok {
			p.mu.Unlock()
			return fmt.Errorf("consumer %s partition %d: %w", p.consumer, part, driver.ErrFenced)
		}
		fences = append(fences, driver.Fence{Partition: part, Token: token})
	}
	p.mu.Unlock()
	return p.leases.Fence(ctx, tx, p.consumer, p.member, fences)
}

// run keeps the process's share of the partitions until ctx ends, then
// leaves the group, freeing every lease the process holds.
func (p *partitioner) run(ctx context.Context) {
	for {
		wait := p.step(ctx)
		select {
		case <-ctx.Done():
			p.leave()
			return
		case <-time.After(wait):
		}
	}
}

// step renews the process's membership and leases once, hands back what
// it should not hold, takes what it should, and returns how long to wait
// before the next step: a fifth of the lease, or a second while a
// partition that falls to the process is still another's.
func (p *partitioner) step(ctx context.Context) time.Duration {
	tick := p.lease / 5
	// Every call of a step is bounded, so that one that hangs does not
	// keep the process from its next heartbeat: a process that stops
	// renewing loses its place in the group and its leases. Its
	// statements by the lease (past it, a heartbeat is too late anyway):
	// one may have to wait for a connection, and make it (after a freeze
	// whose sessions were ended, every connection of the pool is new,
	// and on a loaded machine a password's SCRAM exchange alone takes
	// seconds); the subscription's assignment by a step (see assign).
	callCtx, cancel := context.WithTimeout(ctx, p.lease)
	members, err := p.leases.Heartbeat(callCtx, p.consumer, p.member, p.lease)
	cancel()
	if err != nil {
		p.logger.WarnContext(ctx, "partitions: heartbeat failed; the leases held run out unless renewed", "error", err)
		return tick
	}
	callCtx, cancel = context.WithTimeout(ctx, p.lease)
	kept, err := p.leases.Renew(callCtx, p.consumer, p.member, p.lease)
	cancel()
	if err != nil {
		p.logger.WarnContext(ctx, "partitions: renewing the leases failed", "error", err)
		return tick
	}
	want := share(members, p.member, p.partitions)
	stopping := closed(p.stop)

	// Keep what is still the process's; hand back the rest once its
	// messages settled; drop at once what another process took.
	next := make(map[int]int64, len(want))
	var give []int
	for part, token := range kept {
		if want[part] || stopping {
			next[part] = token
		} else {
			give = append(give, part)
		}
	}
	sort.Ints(give)
	p.mu.Lock()
	for part := range p.held {
		if _, ok := kept[part]; !ok {
			p.logger.WarnContext(ctx, "partitions: lease lost to another process", "partition", part)
			delete(p.held, part) // its attempts fail their fence from now on
		}
	}
	p.mu.Unlock()
	if err := p.assign(ctx, next); err != nil {
		return tick
	}
	for _, part := range give {
		callCtx, cancel := context.WithTimeout(ctx, p.lease)
		err := p.leases.Release(callCtx, p.consumer, part, p.member)
		cancel()
		if err != nil {
			p.logger.WarnContext(ctx, "partitions: releasing a lease failed; it runs out by itself", "partition", part, "error", err)
		}
	}
	if len(give) > 0 {
		p.logger.InfoContext(ctx, "partitions: handed back", "consumer", p.consumer, "partitions", give, "members", len(members))
	}
	if stopping {
		return tick
	}
	// A take waits while the lease's row is locked by its previous
	// owner's batch between its fence and its commit (Leases.Fence): a
	// moment, or, when that process froze there, until its session ends:
	// the take ends the sessions of an owner frozen past its lease first
	// (endStale), else the server ends the batch's transaction, its
	// deadline and 2 s later. Each take waits a step at most (and its
	// ending of sessions, rare, a step: a take may have to make its
	// connection first, as a heartbeat may), and the takes of a step
	// begin within a step, so that the heartbeat and the renewals come
	// in time: a process must not lose its own leases waiting for
	// another's.
	missing := make([]int, 0, len(want))
	for part := range want {
		if _, ok := next[part]; !ok {
			missing = append(missing, part)
		}
	}
	sort.Ints(missing)
	var took []int
	began := time.Now()
	for _, part := range missing {
		if time.Since(began) >= tick {
			break // the others at the next step
		}
		p.endStale(ctx, part, tick)
		takeCtx, cancel := context.WithTimeout(ctx, tick)
		token, ok, err := p.leases.Acquire(takeCtx, p.consumer, part, p.member, p.lease)
		waited := takeCtx.Err() != nil
		cancel()
		if err != nil && waited && ctx.Err() == nil {
			p.logger.InfoContext(ctx, "partitions: a lease is held by its previous owner's batch; taken at a later step", "partition", part)
			continue
		}
		if err != nil {
			p.logger.WarnContext(ctx, "partitions: taking a lease failed", "partition", part, "error", err)
			continue
		}
		if ok {
			next[part] = token
			took = append(took, part)
		}
	}
	if err := p.assign(ctx, next); err != nil {
		return tick
	}
	if len(took) > 0 {
		p.logger.InfoContext(ctx, "partitions: took", "consumer", p.consumer, "partitions", took, "members", len(members))
	}
	if len(next) < len(want) {
		return min(time.Second, tick)
	}
	return tick
}

// endStale ends the database sessions of partition's previous owner
// when it froze past its lease (driver.SessionEnder): its open
// transaction may hold the lease's row and the rows its attempt wrote,
// and its subscription's session the partition's advisory lock (the
// PostgreSQL transport), which would keep the partition from this
// process until the stale owner goes on or the server ends its
// transaction. Once it goes on, its connections are gone: its attempts
// fail, are tried again and fenced, and it rejoins the group. A failure
// is logged: the take goes on, and may wait. It gives up after limit.
func (p *partitioner) endStale(ctx context.Context, partition int, limit time.Duration) {
	if p.ender == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	owner, ended, err := p.ender.EndStaleOwner(ctx, p.consumer, partition, p.member, p.quiet())
	switch {
	case err != nil:
		p.logger.WarnContext(ctx, "partitions: ending the sessions of the partition's stale owner failed; its new owner may wait for them", "partition", partition, "owner", owner, "error", err)
	case ended > 0:
		p.logger.WarnContext(ctx, "partitions: ended the database sessions of the partition's stale owner, frozen past its lease", "partition", partition, "owner", owner, "sessions", ended)
	}
}

// quiet is how long a stale owner's sessions must have been silent (no
// statement begun or ended) before endStale ends them: three fifths of
// the lease. An owner renews every fifth of it, so one that froze was
// silent that long by the time its lease expired, give or take its last
// step; one that runs late on a loaded machine, its heartbeat missed, is
// heard from sooner, and keeps its sessions.
func (p *partitioner) quiet() time.Duration { return p.lease * 3 / 5 }

// assign makes the subscription consume the partitions of next, unless
// it does already: the fences of the new ones hold before their first
// message, those of the dropped ones until their messages settled. It
// waits a step at most: the subscription goes on dropping, and the next
// step assigns again, and waits again, until the drop is done.
func (p *partitioner) assign(ctx context.Context, next map[int]int64) error {
	parts := slices.Sorted(maps.Keys(next))
	p.mu.Lock()
	if p.assignedOK && slices.Equal(parts, p.assigned) {
		p.mu.Unlock()
		return nil
	}
	p.assignedOK = false // unknown until Assign returns
	for part, token := range next {
		p.held[part] = token
	}
	p.mu.Unlock()
	assignCtx, cancel := context.WithTimeout(ctx, p.lease/5)
	err := p.assigner.Assign(assignCtx, parts)
	waited := assignCtx.Err() != nil
	cancel()
	switch {
	case err != nil && waited && ctx.Err() == nil:
		p.logger.InfoContext(ctx, "partitions: the dropped partitions' messages are still in flight; handed back at a later step", "partitions", parts)
		return err
	case err != nil:
		p.logger.WarnContext(ctx, "partitions: assigning the subscription failed", "partitions", parts, "error", err)
		return err
	}
	p.mu.Lock()
	for part := range p.held {
		if _, ok := next[part]; !ok {
			delete(p.held, part)
		}
	}
	p.assigned, p.assignedOK = parts, true
	p.mu.Unlock()
	return nil
}

// leave hands every partition back and leaves the group, so that the
// other processes take the partitions at their next step instead of
// once the leases expire. It runs once the router closed: no message of
// the consumer is in flight any more.
func (p *partitioner) leave() {
	ctx, cancel := context.WithTimeout(context.Background(), p.lease)
	defer cancel()
	_ = p.assign(ctx, nil) // logged; the subscription may have ended with the router
	if err := p.leases.Leave(ctx, p.consumer, p.member); err != nil {
		p.logger.WarnContext(ctx, "partitions: leaving the group failed; its leases run out by themselves", "error", err)
	}
}

// share returns the partitions, among n, that fall to member among the
// live members (sorted): partition p to the member p mod len(members).
func share(members []string, member string, n int) map[int]bool {
	i := slices.Index(members, member)
	if i < 0 {
		return nil
	}
	want := make(map[int]bool)
	for part := i; part < n; part += len(members) {
		want[part] = true
	}
	return want
}

// closed reports whether c is closed; a nil c never is.
func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
