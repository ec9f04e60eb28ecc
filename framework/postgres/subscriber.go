package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/framework/internal/subscribers"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// The subscriber reads watermill-sql's tables as watermill-sql's own
// subscriber does (rows whose transaction is older than every transaction
// still running, in (transaction_id, offset) order, after the group's row
// in the offsets table), but hands out up to its concurrency of messages
// at once and holds no transaction while they are handled. Each
// subscription has a connection of its own, on which it holds a session
// advisory lock per (offsets table, consumer group): the one subscription
// holding it reads and acknowledges, the others (other processes) stand
// by and try again every PollInterval. The lock ends with the connection,
// so a process that dies hands over at once.
//
// The active subscription also LISTENs on its connection: a trigger on the
// messages table notifies after every INSERT statement, whoever runs it,
// and an idle subscription reads at once when notified. The poll stays:
// it finds what a lost notification or a missing trigger leaves behind.
//
// Each delivery says whether it may be a redelivery
// (framework.MetadataRedelivered), so that the delivery guard counts only
// those. For that the group's row in the offsets table has two columns of
// ours beside watermill-sql's (handedOutColumns): the highest position
// handed out. The statement that reads rows writes it, in its own
// transaction, before a row is handed out, so a crash never makes a row
// that was handed out look new: after a takeover, the rows up to it are
// redeliveries, the rows after it first deliveries.

const (
	// ackFlushInterval is the longest the group's acknowledged position
	// waits in memory before it is written, while messages are in flight.
	ackFlushInterval = 20 * time.Millisecond
	// retryInterval is the pause after a failed query before the
	// subscription connects again.
	retryInterval = time.Second
	// queryTimeout bounds each statement on a subscription's connection.
	queryTimeout = 10 * time.Second
	// triggerLockTimeout bounds the wait for the messages table's lock when
	// the notify trigger is created (a long transaction that inserts holds
	// it off); without the trigger, subscriptions poll.
	triggerLockTimeout = 5 * time.Second
	// notifyRetryMin is the first pause before reading again after a
	// notified read found nothing: the notifying transaction is committed,
	// but its rows are read only once every older transaction has ended.
	// The pause doubles up to PollInterval.
	notifyRetryMin = time.Millisecond
	// notifyTrigger names the trigger and the function it runs.
	notifyTrigger = "effectively_notify"
	// handedOutLock names the advisory lock under which the handed-out
	// columns are added to an offsets table.
	handedOutLock = "effectively_handed_out"
)

// handedOutColumns are the columns the subscriber adds to watermill-sql's
// offsets table: the position of the last message handed out, NULL in a
// group's row written before they existed (unknown) and 0 in a new
// group's (nothing handed out).
var handedOutColumns = [2]string{"handed_out_transaction_id", "handed_out_offset"}

// errClosed is returned by Subscribe after Close.
var errClosed = errors.New("postgres: subscriber closed")

// subscriber is the subscriber of one consumer group on watermill-sql's
// PostgreSQL tables: each Subscribe call is a subscription that hands out
// up to concurrency messages at once.
type subscriber struct {
	db          *sqlx.DB
	group       string
	concurrency int
	cfg         TransportConfig
	log         *slog.Logger

	base      context.Context // cancelled by Close
	cancel    context.CancelFunc
	mu        sync.Mutex // guards closed, noTrigger, noMarks and wg.Add
	closed    bool
	noTrigger map[string]bool // topics whose trigger could not be created
	noMarks   map[string]bool // topics whose handed-out columns could not be added
	wg        sync.WaitGroup
	closeOnce sync.Once
}

var (
	_ message.Subscriber           = (*subscriber)(nil)
	_ message.SubscribeInitializer = (*subscriber)(nil)
)

// newSubscriber returns the subscriber of consumer, whose name is its
// consumer group in every topic, handing out up to concurrency messages
// of each topic at once. Each subscription holds one connection of db for
// as long as it runs: give db a pool of its own, with a connection per
// subscription and one to spare for SubscribeInitialize.
func newSubscriber(db *sqlx.DB, consumer string, concurrency int, cfg TransportConfig) (*subscriber, error) {
	if db == nil {
		return nil, errors.New("postgres: subscriber: missing database (open a pool of its own with postgres.Open)")
	}
	if consumer == "" {
		return nil, errors.New("postgres: subscriber: empty consumer name")
	}
	if concurrency < 1 {
		return nil, fmt.Errorf("postgres: subscriber of %s: concurrency must be at least 1, got %d", consumer, concurrency)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	base, cancel := context.WithCancel(context.Background())
	return &subscriber{
		db:          db,
		group:       consumer,
		concurrency: concurrency,
		cfg:         cfg,
		log:         cfg.Logger.With(slog.String("consumer_group", consumer)),
		base:        base,
		cancel:      cancel,
		noTrigger:   make(map[string]bool),
		noMarks:     make(map[string]bool),
	}, nil
}

// SubscribeInitialize creates topic's tables when they are missing, as
// watermill-sql does, and the group's row in the offsets table, so that
// the group keeps every message published from now on. It adds the
// handed-out columns to the offsets table and the trigger that wakes the
// subscriptions to the messages table, also to tables that exist
// already.
func (s *subscriber) SubscribeInitialize(topic string) error {
	if topic == "" {
		return errors.New("postgres: subscribe: empty topic")
	}
	ctx, cancel := context.WithTimeout(s.base, time.Minute)
	defer cancel()
	return s.initialize(ctx, topic)
}

// initialize creates topic's tables, the handed-out columns and the
// group's row, then the notify trigger. Columns that cannot be added (no
// rights on the table) are logged once per topic, and the deliveries say
// nothing of redelivery; a trigger that cannot be created is logged once
// per topic, and the subscriptions poll.
func (s *subscriber) initialize(ctx context.Context, topic string) error {
	if err := s.initializeTables(ctx, topic); err != nil {
		return err
	}
	if err := s.ensureHandedOut(ctx, topic); err != nil {
		if s.base.Err() != nil || ctx.Err() != nil {
			return fmt.Errorf("initialize %s: %w", topic, err)
		}
		s.mu.Lock()
		warned := s.noMarks[topic]
		s.noMarks[topic] = true
		s.mu.Unlock()
		if !warned {
			s.log.Warn("postgres subscriber: could not add the handed-out columns to the offsets table; every delivery is counted",
				slog.String("topic", topic), slog.Any("error", err))
		}
	}
	if _, err := s.db.ExecContext(ctx, insertZeroOffsets(s.cfg, topic), s.group); err != nil {
		return fmt.Errorf("initialize %s: group: %w", topic, err)
	}
	err := s.ensureTrigger(ctx, topic)
	if err == nil || s.base.Err() != nil || ctx.Err() != nil {
		return nil
	}
	s.mu.Lock()
	warned := s.noTrigger[topic]
	s.noTrigger[topic] = true
	s.mu.Unlock()
	if !warned {
		s.log.Warn("postgres subscriber: could not create the notify trigger; idle subscriptions poll every PollInterval",
			slog.String("topic", topic), slog.Any("error", err), slog.Duration("poll_interval", s.cfg.PollInterval))
	}
	return nil
}

// ensureHandedOut adds the handedOutColumns to topic's offsets table,
// unless it has them, in a transaction of its own under an advisory lock.
// The rows there get NULL (unknown), new rows 0. A failure leaves the
// table as it was.
func (s *subscriber) ensureHandedOut(ctx context.Context, topic string) error {
	table := OffsetsTable(s.cfg.TablePrefix, topic)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("handed-out columns of %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('`+handedOutLock+`', 0))`); err != nil {
		return fmt.Errorf("handed-out columns of %s: lock: %w", topic, err)
	}
	var n int
	err = tx.QueryRowContext(ctx, `SELECT count(*) FROM pg_attribute
		WHERE attrelid = $1::text::regclass AND attname IN ($2, $3) AND NOT attisdropped`,
		table, handedOutColumns[0], handedOutColumns[1]).Scan(&n)
	if err != nil {
		return fmt.Errorf("handed-out columns of %s: %w", topic, err)
	}
	if n == len(handedOutColumns) {
		return nil
	}
	xid, off := handedOutColumns[0], handedOutColumns[1]
	for _, q := range []string{
		`SET LOCAL lock_timeout = ` + strconv.FormatInt(triggerLockTimeout.Milliseconds(), 10),
		`ALTER TABLE ` + table + ` ADD COLUMN IF NOT EXISTS ` + xid + ` xid8, ADD COLUMN IF NOT EXISTS ` + off + ` bigint`,
		`ALTER TABLE ` + table + ` ALTER COLUMN ` + xid + ` SET DEFAULT '0', ALTER COLUMN ` + off + ` SET DEFAULT 0`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("handed-out columns of %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("handed-out columns of %s: commit: %w", topic, err)
	}
	return nil
}

// ensureTrigger adds to topic's messages table, unless it has it, the
// trigger that notifies notifyChannel after each INSERT statement with the
// inserting transaction's id, in a transaction of its own. A transaction
// advisory lock keeps processes that subscribe at once from creating it
// twice.
func (s *subscriber) ensureTrigger(ctx context.Context, topic string) error {
	table := MessagesTable(s.cfg.TablePrefix, topic)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("notify trigger of %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('`+notifyTrigger+`', 0))`); err != nil {
		return fmt.Errorf("notify trigger of %s: lock: %w", topic, err)
	}
	var exists bool
	err = tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_trigger WHERE tgrelid = $1::text::regclass AND tgname = $2)`,
		table, notifyTrigger).Scan(&exists)
	if err != nil {
		return fmt.Errorf("notify trigger of %s: %w", topic, err)
	}
	if exists {
		return nil
	}
	for _, q := range []string{
		`SET LOCAL lock_timeout = ` + strconv.FormatInt(triggerLockTimeout.Milliseconds(), 10),
		`CREATE OR REPLACE FUNCTION ` + notifyTrigger + `() RETURNS trigger LANGUAGE plpgsql AS $$
			BEGIN
				PERFORM pg_notify(TG_ARGV[0], pg_current_xact_id()::text);
				RETURN NULL;
			END $$`,
		`CREATE TRIGGER ` + notifyTrigger + ` AFTER INSERT ON ` + table + ` FOR EACH STATEMENT
			EXECUTE FUNCTION ` + notifyTrigger + `(` + quoteLiteral(notifyChannel(s.cfg.TablePrefix, topic)) + `)`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("notify trigger of %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("notify trigger of %s: commit: %w", topic, err)
	}
	return nil
}

// notifyChannel returns the channel that topic's trigger notifies: the
// messages table's name (MessagesTable's, unquoted) after "notify_", cut
// to PostgreSQL's 63 bytes as table names are.
func notifyChannel(prefix, topic string) string {
	return identifier("notify_" + identifier(prefix+"watermill_"+topic))
}

func quoteLiteral(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// initializeTables runs watermill-sql's schema queries, in one
// transaction.
func (s *subscriber) initializeTables(ctx context.Context, topic string) error {
	queries, err := schemaAdapter(s.cfg).SchemaInitializingQueries(wsql.SchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	offsets, err := offsetsAdapter(s.cfg).SchemaInitializingQueries(wsql.OffsetsSchemaInitializingQueriesParams{Topic: topic})
	if err != nil {
		return fmt.Errorf("initialize %s: %w", topic, err)
	}
	queries = append(queries, offsets...)
	tx, err := s.db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("initialize %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	for _, q := range queries {
		if _, err := tx.ExecContext(ctx, q.Query, q.Args...); err != nil {
			return fmt.Errorf("initialize %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("initialize %s: commit: %w", topic, err)
	}
	return nil
}

// Subscribe initializes topic and starts a subscription of it for the
// group. The channel closes when ctx ends or the subscriber closes; the
// context of each message is cancelled then too, and after its Ack or
// Nack.
func (s *subscriber) Subscribe(ctx context.Context, topic string) (<-chan *message.Message, error) {
	if topic == "" {
		return nil, errors.New("postgres: subscribe: empty topic")
	}
	subCtx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(s.base, cancel)
	if err := s.initialize(subCtx, topic); err != nil {
		stop()
		cancel()
		if s.base.Err() != nil {
			return nil, errClosed
		}
		return nil, fmt.Errorf("postgres: subscribe to %s: %w", topic, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		stop()
		cancel()
		return nil, errClosed
	}
	marking := !s.noMarks[topic]
	sub := &subscription{
		s:       s,
		topic:   topic,
		q:       newSubscriptionQueries(s.cfg, topic, marking),
		marking: marking,
		ctx:     subCtx,
		cancel:  func() { stop(); cancel() },
		out:     make(chan *message.Message),
		results: make(chan result),
		sent:    make(map[*delivery]struct{}, s.concurrency),
		log:     s.log.With(slog.String("topic", topic)),

		reported: pipeline.Reported(ctx),
	}
	s.wg.Add(1)
	go sub.run()
	return sub.out, nil
}

// Close stops every subscription: message contexts are cancelled, the
// acknowledgements given so far are written, and the locks released. It
// waits for the subscriptions and is idempotent.
func (s *subscriber) Close() error {
	s.closeOnce.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.cancel()
		s.mu.Unlock()
		s.wg.Wait()
	})
	return nil
}

// insertZeroOffsets returns watermill-sql's query that gives a group its
// row in topic's offsets table, from the first message.
func insertZeroOffsets(cfg TransportConfig, topic string) string {
	return `INSERT INTO ` + OffsetsTable(cfg.TablePrefix, topic) +
		` (consumer_group, offset_acked, last_processed_transaction_id) VALUES ($1, 0, '0') ON CONFLICT DO NOTHING`
}

// subscriptionQueries are the statements of one topic's subscription.
type subscriptionQueries struct {
	lock, unlock, position, read, ack, zero, lower string
	listen, unlisten, newest                       string
}

// newSubscriptionQueries returns the statements of topic's subscription;
// with marking, the offsets table has the handedOutColumns: the position
// reads them, each read writes them, and lower moves them back.
func newSubscriptionQueries(cfg TransportConfig, topic string, marking bool) subscriptionQueries {
	messages, offsets := MessagesTable(cfg.TablePrefix, topic), OffsetsTable(cfg.TablePrefix, topic)
	xid, off := handedOutColumns[0], handedOutColumns[1]
	// watermill-sql's SelectQuery, from the subscription's own position
	// instead of the group's locked row, and with the position compared as
	// a row: the primary key's index then starts at the position, instead
	// of filtering every row before it (a read took milliseconds once
	// 20,000 rows were behind it).
	selectRows := `SELECT "offset", transaction_id, uuid, payload, metadata FROM ` + messages + `
			WHERE (transaction_id, "offset") > ($1::text::xid8, $2)
			AND transaction_id < pg_snapshot_xmin(pg_current_snapshot())
			ORDER BY transaction_id, "offset" LIMIT $3`
	q := subscriptionQueries{
		// The key names the offsets table by its oid, so that the tables
		// of one name in other schemas have keys of their own.
		lock: `SELECT k, pg_try_advisory_lock(k) FROM (SELECT hashtextextended(` +
			`$1::text::regclass::oid::text || '/' || $2::text, 0) AS k) AS key`,
		unlock:   `SELECT pg_advisory_unlock($1)`,
		listen:   `LISTEN ` + quoteIdent(notifyChannel(cfg.TablePrefix, topic)),
		unlisten: `UNLISTEN *`,
		newest:   `SELECT COALESCE(max(transaction_id)::text, '0') FROM ` + messages,
		position: `SELECT COALESCE(offset_acked, 0), last_processed_transaction_id, NULL::text, NULL::bigint FROM ` + offsets +
			` WHERE consumer_group = $1`,
		zero: insertZeroOffsets(cfg, topic),
		read: selectRows,
		// watermill-sql's AckMessageQuery, which never moves a group back.
		ack: `INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id)
			VALUES ($1, $2, $3::text::xid8)
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = excluded.offset_acked,
				last_processed_transaction_id = excluded.last_processed_transaction_id
			WHERE (o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
				(excluded.last_processed_transaction_id, excluded.offset_acked)`,
	}
	if !marking {
		return q
	}
	q.position = `SELECT COALESCE(offset_acked, 0), last_processed_transaction_id, ` + xid + `::text, ` + off + ` FROM ` + offsets +
		` WHERE consumer_group = $1`
	// The rows read, and in the same statement (one transaction, committed
	// before the rows are handed out) the last of them as the group's
	// handed-out position, and the acknowledged position ($5, $6): each
	// only ever moves forward here.
	acks := `(o.last_processed_transaction_id, COALESCE(o.offset_acked, 0)) <
			(excluded.last_processed_transaction_id, excluded.offset_acked)`
	handsOut := `(COALESCE(o.` + xid + `, '0'), COALESCE(o.` + off + `, 0)) < (excluded.` + xid + `, excluded.` + off + `)`
	q.read = `WITH r AS (` + selectRows + `),
		last AS (SELECT transaction_id, "offset" FROM r ORDER BY transaction_id DESC, "offset" DESC LIMIT 1),
		w AS (
			INSERT INTO ` + offsets + ` AS o (consumer_group, offset_acked, last_processed_transaction_id, ` + xid + `, ` + off + `)
			SELECT $4::text, $5::bigint, $6::text::xid8, COALESCE(last.transaction_id, '0'), COALESCE(last."offset", 0)
			FROM (SELECT) AS one LEFT JOIN last ON true
			ON CONFLICT (consumer_group) DO UPDATE SET
				offset_acked = CASE WHEN ` + acks + ` THEN excluded.offset_acked ELSE o.offset_acked END,
				last_processed_transaction_id = CASE WHEN ` + acks + `
					THEN excluded.last_processed_transaction_id ELSE o.last_processed_transaction_id END,
				` + xid + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + xid + ` ELSE o.` + xid + ` END,
				` + off + ` = CASE WHEN ` + handsOut + ` THEN excluded.` + off + ` ELSE o.` + off + ` END
			WHERE ` + acks + ` OR ` + handsOut + `
		)
		SELECT "offset", transaction_id, uuid, payload, metadata FROM r ORDER BY transaction_id, "offset"`
	// On close: back to the last row this subscription handed out, when
	// it read further, so that the next one hands out the rest as first
	// deliveries.
	q.lower = `UPDATE ` + offsets + ` SET ` + xid + ` = $2::text::xid8, ` + off + ` = $3
		WHERE consumer_group = $1 AND (` + xid + `, ` + off + `) > ($2::text::xid8, $3)`
	return q
}

// position is a row's place in a topic: rows are read in this order.
type position struct {
	xid    uint64
	offset int64
}

func (p position) less(o position) bool {
	return p.xid < o.xid || (p.xid == o.xid && p.offset < o.offset)
}

// row is a message read from the topic and not yet acknowledged in
// order.
type row struct {
	pos               position
	uuid              string
	payload, metadata []byte
	acked             bool
	current           *delivery // handed out and not yet resolved
	queued            bool      // waits in the queue to be handed out
	resendAt          time.Time // nacked: handed out again then
	handedOut         bool      // this process handed it out before
}

// delivery is one handing out of a row.
type delivery struct {
	sub    *subscription
	r      *row
	msg    *message.Message
	cancel context.CancelFunc
	sentAt time.Time
}

type result struct {
	d     *delivery
	acked bool
}

// waiter is a goroutine that waits on the subscription's connection for a
// notification, which it sends on done, as it ends.
type waiter struct {
	cancel context.CancelFunc
	done   chan wake // buffered: receives once
}

// wake is how a waiter ended.
type wake struct {
	notified bool
	xid      uint64 // the notifying transaction, zero when unknown
	err      error  // the connection failed
}

// subscription is the state of one Subscribe call, owned by its run
// goroutine.
type subscription struct {
	s       *subscriber
	topic   string
	q       subscriptionQueries
	ctx     context.Context
	cancel  context.CancelFunc
	out     chan *message.Message
	results chan result
	log     *slog.Logger
	// reported says that the reader reports each message's outcome
	// (pipeline.SettleReported): no goroutine watches a message then.
	reported bool
	msgWG    sync.WaitGroup // the goroutines watching messages

	conn    *sql.Conn // nil until connected
	key     int64     // the advisory lock's key
	locked  bool
	retryAt time.Time // when to connect or try the lock again

	// With marking, the group's row holds its handed-out position (see
	// handedOutColumns), and each delivery says whether it may be a
	// redelivery (see redelivered).
	marking    bool
	takenMark  position // the group's handed-out position when the lock was taken
	unknownXID uint64   // when that was unknown, the newest transaction with a row then
	handedHigh position // the last row handed out since the lock was taken

	listening    bool          // conn LISTENs on the topic's channel
	listenWarned bool          // a failed LISTEN was logged
	waiter       *waiter       // waits on conn for a notification, while idle
	notifiedXID  uint64        // the newest notified transaction, until read past
	notifyRetry  time.Duration // the pause before reading again for notifiedXID

	window  []*row                 // read and not acknowledged in order, in order
	next    *delivery              // of the queue's head, while it waits to be taken
	queue   []*row                 // to hand out, in order
	waiting []*row                 // nacked, until their resendAt
	sent    map[*delivery]struct{} // handed out and not yet resolved
	cursor  position               // the last row read
	acked   position               // the end of the acknowledged prefix
	dirty   bool                   // acked is not written yet
	dirtyN  int                    // rows acknowledged since the last write
	dirtyAt time.Time
	readAt  time.Time // when to look for new rows again (zero: now)
}

func (sub *subscription) run() {
	defer sub.s.wg.Done()
	defer close(sub.out)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		if sub.ctx.Err() != nil {
			sub.shutdown()
			return
		}
		now := time.Now()
		sub.step(now)

		var out chan<- *message.Message
		var msg *message.Message
		if sub.locked && len(sub.queue) > 0 && len(sub.sent) < sub.s.concurrency {
			if sub.next == nil || sub.next.r != sub.queue[0] {
				sub.dropNext()
				sub.next = sub.deliveryOf(sub.queue[0])
			}
			out, msg = sub.out, sub.next.msg
		}
		if sub.waiter == nil && sub.idle(now) {
			sub.startWaiting(sub.readAt)
		}
		var woke <-chan wake
		if sub.waiter != nil {
			woke = sub.waiter.done
		}
		timer.Reset(sub.wakeAt(now).Sub(now))
		select {
		case <-sub.ctx.Done():
		case w := <-woke:
			if err := sub.woke(w); err != nil {
				sub.lost("wait for notifications", err)
			}
		case out <- msg:
			d := sub.next
			sub.next = nil
			sub.queue[0] = nil
			sub.queue = sub.queue[1:]
			d.r.queued = false
			d.r.current = d
			d.r.handedOut = true
			if sub.handedHigh.less(d.r.pos) {
				sub.handedHigh = d.r.pos
			}
			d.sentAt = time.Now()
			sub.sent[d] = struct{}{}
			if !sub.reported {
				sub.msgWG.Go(func() { subscribers.Watch(sub.ctx, d.msg, d) })
			}
		case res := <-sub.results:
			sub.resolve(res, time.Now())
		case <-timer.C:
		}
	}
}

// step does what is due: take the lock, write the acknowledged position,
// read new rows, queue the nacked rows whose pause passed and the rows
// whose delivery outlived the ack deadline.
func (sub *subscription) step(now time.Time) {
	if !sub.locked && !now.Before(sub.retryAt) {
		if err := sub.acquire(); err != nil {
			sub.lost("take the group's lock", err)
			return
		}
	}
	if !sub.locked {
		return
	}
	if sub.flushDue(now) {
		if err := sub.writeAcked(); err != nil {
			sub.lost("write the acknowledged position", err)
			return
		}
	}
	if sub.readDue(now) {
		if err := sub.read(now); err != nil {
			sub.lost("read messages", err)
			return
		}
	}
	kept := sub.waiting[:0]
	for _, r := range sub.waiting {
		if !r.acked && !now.Before(r.resendAt) {
			sub.enqueue(r)
		} else if !r.acked {
			kept = append(kept, r)
		}
	}
	clear(sub.waiting[len(kept):])
	sub.waiting = kept
	for len(sub.queue) > 0 && sub.queue[0].acked { // a late Ack of a row given up
		sub.queue[0].queued = false
		sub.queue[0] = nil
		sub.queue = sub.queue[1:]
	}
	for d := range sub.sent {
		if now.Sub(d.sentAt) >= sub.s.cfg.AckDeadline {
			// Given up: handed out again; a late Ack still counts.
			sub.unsend(d)
			sub.enqueue(d.r)
		}
	}
}

func (sub *subscription) enqueue(r *row) {
	if r.queued || r.acked {
		return
	}
	r.queued = true
	sub.queue = append(sub.queue, r)
}

// wakeAt returns when step has something to do next, at the latest an
// hour from now.
func (sub *subscription) wakeAt(now time.Time) time.Time {
	at := now.Add(time.Hour)
	earlier := func(t time.Time) {
		if t.Before(at) {
			at = t
		}
	}
	if !sub.locked {
		earlier(sub.retryAt)
		return at
	}
	if len(sub.queue) == 0 && sub.readAt.After(now) {
		earlier(sub.readAt)
	}
	if sub.dirty {
		earlier(sub.dirtyAt.Add(ackFlushInterval))
	}
	for _, r := range sub.waiting {
		earlier(r.resendAt)
	}
	for d := range sub.sent {
		earlier(d.sentAt.Add(sub.s.cfg.AckDeadline))
	}
	return at
}

// idle reports whether the subscription waits for new rows only, to be
// woken by a notification.
func (sub *subscription) idle(now time.Time) bool {
	return sub.locked && sub.listening && len(sub.queue) == 0 && sub.readAt.After(now)
}

// startWaiting starts a waiter on the connection, until a notification
// comes, until, or stopWaiting.
func (sub *subscription) startWaiting(until time.Time) {
	ctx, cancel := context.WithDeadline(sub.ctx, until)
	w := &waiter{cancel: cancel, done: make(chan wake, 1)}
	conn := sub.conn
	go func() {
		defer cancel()
		w.done <- waitForNotification(ctx, conn)
	}()
	sub.waiter = w
}

// stopWaiting ends the waiter, if any, before the connection is used,
// recording a notification it received. An error of the connection is
// left to the statement that follows.
func (sub *subscription) stopWaiting() {
	if sub.waiter == nil {
		return
	}
	sub.waiter.cancel()
	_ = sub.woke(<-sub.waiter.done)
}

// woke records how the waiter ended: a notification reads at once. It
// returns the waiter's error.
func (sub *subscription) woke(w wake) error {
	sub.waiter = nil
	if w.notified {
		sub.readAt = time.Time{}
		sub.notifiedXID = max(sub.notifiedXID, w.xid)
		sub.notifyRetry = 0
	}
	return w.err
}

// waitForNotification waits on conn, which LISTENs, for a notification
// until ctx ends. pgx keeps the notifications that come during other
// statements for the next wait, and the context's end interrupts the
// wait without closing the connection.
func waitForNotification(ctx context.Context, conn *sql.Conn) wake {
	var n *pgconn.Notification
	err := conn.Raw(func(dc any) error {
		c, ok := dc.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("wait for a notification: driver connection %T is not pgx's", dc)
		}
		var err error
		n, err = c.Conn().WaitForNotification(ctx)
		return err
	})
	switch {
	case n != nil:
		xid, _ := strconv.ParseUint(n.Payload, 10, 64) // another payload: just a wake-up
		return wake{notified: true, xid: xid}
	case err != nil && ctx.Err() == nil:
		return wake{err: fmt.Errorf("wait for a notification: %w", err)}
	}
	return wake{}
}

// listen makes the connection LISTEN on the topic's channel. Without it
// (logged once), the subscription polls.
func (sub *subscription) listen(ctx context.Context) {
	if _, err := sub.conn.ExecContext(ctx, sub.q.listen); err != nil {
		if !sub.listenWarned {
			sub.listenWarned = true
			sub.log.Warn("postgres subscriber: could not LISTEN; polling every PollInterval",
				slog.Any("error", err), slog.Duration("poll_interval", sub.s.cfg.PollInterval))
		}
		return
	}
	sub.listening = true
}

// deliveryOf returns a new delivery of r, with a message of its own,
// which says whether it may be a redelivery (see redelivered).
func (sub *subscription) deliveryOf(r *row) *delivery {
	msg := storedmsg.Message(r.uuid, r.payload, r.metadata) // never the producer's word on redelivery
	if said, known := sub.redelivered(r); known {
		msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(said))
	}
	ctx, cancel := context.WithCancel(sub.ctx)
	d := &delivery{sub: sub, r: r, msg: msg, cancel: cancel}
	if sub.reported {
		ctx = pipeline.With[pipeline.Settler](ctx, d)
	}
	msg.SetContext(ctx)
	return d
}

// redelivered tells whether r, about to be handed out, may have been
// handed out before: yes when this process did, or when it is at or below
// the group's handed-out position read when the lock was taken (another
// process, or this one before it lost its connection, handed it out, or
// read it to); no when it is after that position, since every read writes
// the position past its rows before they are handed out. known is false
// without the handed-out columns, and for the rows there when the lock
// was taken while the group's position was unknown (written by a
// subscriber that did not mark).
func (sub *subscription) redelivered(r *row) (said, known bool) {
	switch {
	case r.handedOut:
		return true, true
	case !sub.marking:
		return false, false
	case !sub.takenMark.less(r.pos):
		return true, true
	case r.pos.xid <= sub.unknownXID:
		return false, false
	}
	return false, true
}

// queryContext returns the context of a statement on the subscription's
// connection: not cancelled by Close, since a statement cut short loses the
// connection (and the last write of the acknowledged position with it),
// but bounded by queryTimeout.
func (sub *subscription) queryContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(sub.ctx), queryTimeout)
}

// unsend forgets d, the current delivery of its row.
func (sub *subscription) unsend(d *delivery) {
	d.r.current = nil
	delete(sub.sent, d)
}

// dropNext forgets the delivery prepared for the queue's head.
func (sub *subscription) dropNext() {
	if sub.next != nil {
		sub.next.cancel()
		sub.next = nil
	}
}

// Settled cancels the message's context and hands its outcome to the run
// loop (pipeline.Settler). After the subscription ended it drops it: the
// shutdown read the message's state itself.
func (d *delivery) Settled(acked bool) {
	d.cancel()
	select {
	case d.sub.results <- result{d: d, acked: acked}:
	case <-d.sub.ctx.Done():
	}
}

// resolve records an Ack or Nack: an Ack of any delivery of a row
// acknowledges it; a Nack of its current delivery hands it out again
// after ResendInterval.
func (sub *subscription) resolve(res result, now time.Time) {
	r := res.d.r
	current := r.current == res.d
	if current {
		sub.unsend(res.d)
	}
	if res.acked {
		r.acked = true
		sub.advance(now)
		return
	}
	if current && !r.acked {
		r.resendAt = now.Add(sub.s.cfg.ResendInterval)
		sub.waiting = append(sub.waiting, r)
	}
}

// advance moves the acknowledged position over the acknowledged rows at
// the head of the window: a row acknowledged out of order waits for those
// before it.
func (sub *subscription) advance(now time.Time) {
	n := 0
	for n < len(sub.window) && sub.window[n].acked {
		sub.acked = sub.window[n].pos
		n++
	}
	if n == 0 {
		return
	}
	clear(sub.window[:n])
	sub.window = sub.window[n:]
	if !sub.dirty {
		sub.dirtyAt = now
	}
	sub.dirty = true
	sub.dirtyN += n
}

// flushDue reports whether to write the acknowledged position now: a
// batch of rows is acknowledged, nothing is in flight or queued, or it
// waited ackFlushInterval; with marking, not when a read is due, which
// writes it.
func (sub *subscription) flushDue(now time.Time) bool {
	if !sub.dirty || (sub.marking && sub.readDue(now)) {
		return false
	}
	idle := len(sub.sent) == 0 && len(sub.queue) == 0
	return idle || sub.dirtyN >= sub.s.cfg.BatchSize || now.Sub(sub.dirtyAt) >= ackFlushInterval
}

// writeAcked writes the acknowledged position on the subscription's
// connection, which holds the group's lock.
func (sub *subscription) writeAcked() error {
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	_, err := sub.conn.ExecContext(ctx, sub.q.ack, sub.s.group, sub.acked.offset, strconv.FormatUint(sub.acked.xid, 10))
	if err != nil {
		return fmt.Errorf("write acknowledged offset %d: %w", sub.acked.offset, err)
	}
	sub.dirty, sub.dirtyN = false, 0
	return nil
}

// room returns how many rows the window has room for: it holds at most
// concurrency + BatchSize rows read and not acknowledged in order.
func (sub *subscription) room() int {
	return sub.s.concurrency + sub.s.cfg.BatchSize - len(sub.window)
}

// readDue reports whether to read now: the queue is empty, it is time,
// and the window has room for BatchSize rows, or for fewer when nothing
// in flight can make more (a read costs a round trip and a commit, be it
// for one row or many).
func (sub *subscription) readDue(now time.Time) bool {
	if len(sub.queue) > 0 || now.Before(sub.readAt) {
		return false
	}
	room := sub.room()
	return room >= sub.s.cfg.BatchSize || (room > 0 && len(sub.sent) == 0)
}

// read reads the rows after the cursor that fit the window. With
// marking, the same statement writes the handed-out position and the
// acknowledged one.
func (sub *subscription) read(now time.Time) error {
	room := sub.room()
	if room <= 0 {
		return nil
	}
	sub.stopWaiting()
	ctx, cancel := sub.queryContext()
	defer cancel()
	args := []any{strconv.FormatUint(sub.cursor.xid, 10), sub.cursor.offset, room}
	if sub.marking {
		args = append(args, sub.s.group, sub.acked.offset, strconv.FormatUint(sub.acked.xid, 10))
	}
	rows, err := sub.conn.QueryContext(ctx, sub.q.read, args...)
	if err != nil {
		return fmt.Errorf("read: %w", err)
	}
	schema := schemaAdapter(sub.s.cfg)
	var read []*row
	for rows.Next() {
		wr, err := schema.UnmarshalMessage(wsql.UnmarshalMessageParams{Row: rows})
		if err != nil {
			_ = rows.Close()
			return fmt.Errorf("read: %w", err)
		}
		xid, _ := wr.ExtraData["transaction_id"].(wsql.XID8)
		read = append(read, &row{
			pos:      position{xid: uint64(xid), offset: wr.Offset},
			uuid:     string(wr.UUID),
			payload:  wr.Payload,
			metadata: wr.Metadata,
		})
	}
	// Closed without error, the statement committed: the handed-out
	// position is written, and the rows may be handed out.
	if err := errors.Join(rows.Err(), rows.Close()); err != nil {
		return fmt.Errorf("read: %w", err)
	}
	if sub.marking {
		sub.dirty, sub.dirtyN = false, 0
	}
	for _, r := range read {
		sub.window = append(sub.window, r)
		sub.enqueue(r)
		sub.cursor = r.pos
	}
	if len(read) < room {
		sub.readAt = sub.nextRead(now) // caught up
	} else {
		sub.readAt = time.Time{}
	}
	return nil
}

// nextRead returns when to read again after a read that found every
// visible row: after PollInterval, or sooner while the rows of a notified
// transaction are not read yet (they become visible once every
// transaction older than it ended), with pauses doubling up to
// PollInterval.
func (sub *subscription) nextRead(now time.Time) time.Time {
	poll := sub.s.cfg.PollInterval
	if sub.notifiedXID == 0 || sub.cursor.xid >= sub.notifiedXID {
		sub.notifiedXID, sub.notifyRetry = 0, 0
		return now.Add(poll)
	}
	sub.notifyRetry = max(2*sub.notifyRetry, notifyRetryMin)
	if sub.notifyRetry >= poll {
		sub.notifiedXID, sub.notifyRetry = 0, 0
		return now.Add(poll)
	}
	return now.Add(sub.notifyRetry)
}

// acquire connects when not connected and tries the group's lock; with
// it, it reads the group's position. Without it, it stands by until
// PollInterval passed.
func (sub *subscription) acquire() error {
	if sub.conn == nil {
		conn, err := sub.s.db.Conn(sub.ctx)
		if err != nil {
			return fmt.Errorf("connect: %w", err)
		}
		sub.conn = conn
	}
	ctx, cancel := sub.queryContext()
	defer cancel()
	var got bool
	err := sub.conn.QueryRowContext(ctx, sub.q.lock, OffsetsTable(sub.s.cfg.TablePrefix, sub.topic), sub.s.group).Scan(&sub.key, &got)
	if err != nil {
		return fmt.Errorf("lock: %w", err)
	}
	if !got {
		sub.retryAt = time.Now().Add(sub.s.cfg.PollInterval)
		return nil
	}
	sub.listen(ctx)
	// The rows already there are read as soon as they are visible, as if
	// their transactions had just notified: a transaction open elsewhere
	// may hide them from the first read, and no notification comes for
	// them.
	var newest string
	if err := sub.conn.QueryRowContext(ctx, sub.q.newest).Scan(&newest); err != nil {
		return fmt.Errorf("newest message: %w", err)
	}
	if xid, err := strconv.ParseUint(newest, 10, 64); err == nil {
		sub.notifiedXID = max(sub.notifiedXID, xid)
	}
	stored, mark, err := sub.storedPosition(ctx)
	if err != nil {
		return err
	}
	// The rows handed out up to now (see redelivered) are the ones up to
	// the group's handed-out position; when that is unknown, any row there
	// now may have been.
	sub.dropNext() // prepared before, it may say otherwise
	sub.handedHigh = position{}
	sub.takenMark, sub.unknownXID = position{}, 0
	if mark != nil {
		sub.takenMark = *mark
	} else if xid, err := strconv.ParseUint(newest, 10, 64); err == nil {
		sub.unknownXID = xid
	} else {
		sub.unknownXID = math.MaxUint64
	}
	if sub.cursor.less(stored) {
		sub.cursor = stored
	}
	if sub.acked.less(stored) {
		sub.acked = stored
	}
	sub.locked = true
	sub.readAt = time.Time{}
	sub.log.Debug("postgres subscriber: active for its group")
	return nil
}

// storedPosition reads the group's acknowledged position, giving it the
// zero row when it has none, and its handed-out position: nil when
// unknown (see handedOutColumns).
func (sub *subscription) storedPosition(ctx context.Context) (acked position, handedOut *position, err error) {
	var (
		xid        wsql.XID8
		markXID    sql.NullString
		markOffset sql.NullInt64
	)
	err = sub.conn.QueryRowContext(ctx, sub.q.position, sub.s.group).Scan(&acked.offset, &xid, &markXID, &markOffset)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := sub.conn.ExecContext(ctx, sub.q.zero, sub.s.group); err != nil {
			return position{}, nil, fmt.Errorf("give the group its row: %w", err)
		}
		return position{}, &position{}, nil // a new row: nothing handed out
	}
	if err != nil {
		return position{}, nil, fmt.Errorf("read the group's position: %w", err)
	}
	acked.xid = uint64(xid)
	if !markXID.Valid || !markOffset.Valid {
		return acked, nil, nil
	}
	mx, err := strconv.ParseUint(markXID.String, 10, 64)
	if err != nil {
		return position{}, nil, fmt.Errorf("read the group's handed-out position %q: %w", markXID.String, err)
	}
	return acked, &position{xid: mx, offset: markOffset.Int64}, nil
}

// lost gives up the connection, and the lock with it, after a failed
// query; the subscription connects again after retryInterval. It keeps
// its window: the rows in flight keep their place.
func (sub *subscription) lost(what string, err error) {
	if sub.ctx.Err() != nil {
		return
	}
	sub.log.Warn("postgres subscriber: could not "+what+"; connecting again",
		slog.Any("error", err), slog.Duration("retry_in", retryInterval))
	sub.discard()
	sub.retryAt = time.Now().Add(retryInterval)
}

// discard closes the subscription's connection instead of returning it to
// the pool, which ends its session and its lock.
func (sub *subscription) discard() {
	sub.stopWaiting()
	if sub.conn == nil {
		return
	}
	_ = sub.conn.Raw(func(any) error { return driver.ErrBadConn })
	_ = sub.conn.Close()
	sub.conn, sub.locked, sub.listening = nil, false, false
}

// shutdown ends the subscription: it cancels the message contexts,
// writes the acknowledged position, and releases the lock.
func (sub *subscription) shutdown() {
	sub.cancel()
	sub.stopWaiting()
	sub.dropNext()
	sub.msgWG.Wait()
	for d := range sub.sent {
		select {
		case <-d.msg.Acked():
			d.r.acked = true
		default:
		}
		d.cancel()
	}
	sub.advance(time.Now())
	if sub.conn == nil {
		return
	}
	if sub.locked && sub.dirty {
		if err := sub.writeAcked(); err != nil {
			sub.log.Warn("postgres subscriber: could not write the acknowledged position on close; those messages come again",
				slog.Any("error", err))
		}
	}
	ctx, cancel := sub.queryContext()
	defer cancel()
	if sub.locked && sub.marking {
		// Nothing is handed out any more: the rows read but never handed
		// out are first deliveries for the next subscription. The position
		// stays at least where it was when the lock was taken, since the
		// rows before it may have been handed out by another.
		last := sub.handedHigh
		if last.less(sub.takenMark) {
			last = sub.takenMark
		}
		if _, err := sub.conn.ExecContext(ctx, sub.q.lower, sub.s.group, strconv.FormatUint(last.xid, 10), last.offset); err != nil {
			sub.log.Warn("postgres subscriber: could not write the handed-out position on close; the messages read ahead come again as redeliveries",
				slog.Any("error", err))
		}
	}
	if sub.locked {
		if _, err := sub.conn.ExecContext(ctx, sub.q.unlock, sub.key); err != nil {
			sub.discard()
			return
		}
	}
	if sub.listening {
		if _, err := sub.conn.ExecContext(ctx, sub.q.unlisten); err != nil {
			sub.discard()
			return
		}
	}
	_ = sub.conn.Close()
	sub.conn, sub.locked, sub.listening = nil, false, false
}
