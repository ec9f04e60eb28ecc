package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// sqliteScenario: the example service on the SQLite transport draining a
// backlog already in its file, against the file's own limit for the same
// writes.
func sqliteScenario() Scenario {
	return Scenario{
		Name:  "sqlite",
		Title: "SQLite transport",
		About: fmt.Sprintf("The example service (`EFFECTIVELY_TRANSPORT=sqlite`) on a file of its own that already holds "+
			"the messages (inserted by the documented `INSERT` into `pubsub_messages`, by this program: another "+
			"process), with its default configuration (%d messages in flight; 64 with `batch_size: 1`) and with `defaults: {concurrency: 1}`. The baseline is the "+
			"machine's limit measured in the same run, on a file on the same disk: Debian's `sqlite3` program (C: no "+
			"Go, no driver, no transport) running a script generated beforehand from the same backlog, on a file "+
			"the service's migrations made, with the service's pragmas (read from a connection the framework "+
			"opened; SQLite's own automatic checkpoints, where the service checkpoints on a connection of its own): "+
			"per event the framework's dedup mark into its `processed_events` table (its key and index) and the "+
			"business row when the mark was new (`changes() = 1`), 100 events per transaction, each statement "+
			"parsed as the program reads it. Beside it, the raw limit in Go: a process of its own writing the same "+
			"two inserts with prepared statements into two plain tables, 100 events per transaction. In the latency "+
			"phase the producer inserts one message per transaction; the service, in another process, sees it "+
			"through its watch of the newest offset (every 10ms). Gates: the default configuration at least %.2f "+
			"of the sqlite3 program's effects/s, its start-up to first effect below %s.",
			app.DefaultSQLiteConcurrency, SQLiteLimitGate, seconds(StartUpGate)),
		Runs: []Run{
			{Name: sqliteDefault, Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureSQLiteService(ctx, env, "")
			}},
			{Name: "example service, concurrency 1", Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureSQLiteService(ctx, env, "defaults:\n  concurrency: 1\n")
			}},
			{Name: "example service, a transaction per message (batch_size 1)", Measure: func(ctx context.Context, env *Env) (Result, error) {
				return measureSQLiteService(ctx, env, "defaults:\n  batch_size: 1\n")
			}},
			{Name: "raw limit: two inserts per event, 100 events per transaction", Measure: measureSQLiteRaw},
			{Name: sqliteLimit, Baseline: true, Measure: measureSQLite3Limit},
		},
		Children: []Child{{Name: "raw", Main: sqliteRawMain}},
		Scale:    SQLiteScale,
		Gate: &Gate{
			Run: sqliteDefault, Of: sqliteLimit, Min: SQLiteLimitGate,
			And: &Gate{Run: sqliteDefault, MaxStartUp: StartUpGate},
		},
	}
}

// The SQLite scenario's runs that its gates name.
var (
	sqliteDefault = fmt.Sprintf("example service, default configuration (concurrency %d)", app.DefaultSQLiteConcurrency)
	sqliteLimit   = "limit: the sqlite3 program, the service's schema and pragmas, 100 events per transaction"
)

// SQLiteScale is how many times Options.Events the SQLite scenario's runs
// drain (100,000 messages at the default): at 15,000 to 50,000 effects a
// second, Options.Events alone drains in half a second to a second, in
// which the service's first batches weigh as much as its steady pace
// (its three rounds of 20,000 ran at 15,400 to 19,100/s where those of
// 100,000 ran at 19,900 to 21,300/s, an hour apart).
const SQLiteScale = 5

// sqliteMessagesInsert is the INSERT docs/transports.md documents. Its
// arguments are the message's uuid (the event's id) and payload.
const sqliteMessagesInsert = `INSERT INTO pubsub_messages (topic, uuid, payload, metadata) VALUES ('` + EventType + `', ?, CAST(? AS BLOB), '{"content-type":"application/cloudevents+json"}')`

// sqliteService is the example service on a SQLite file.
type sqliteService struct {
	env    *Env
	file   string
	config string // EFFECTIVELY_CONFIG; empty for none
	db     *sqlx.DB
}

func measureSQLiteService(ctx context.Context, env *Env, config string) (Result, error) {
	s, err := newSQLiteService(ctx, env, config)
	if err != nil {
		return Result{}, err
	}
	return Drain(ctx, env, s)
}

// newSQLiteService prepares the example service on a file of the run's
// own, with config as its configuration file (none when empty).
func newSQLiteService(ctx context.Context, env *Env, config string) (*sqliteService, error) {
	s := &sqliteService{env: env, file: filepath.Join(env.Dir, "service.db")}
	if config != "" {
		s.config = filepath.Join(env.Dir, "config.yaml")
		if err := os.WriteFile(s.config, []byte(config), 0o600); err != nil {
			return nil, fmt.Errorf("write config: %w", err)
		}
	}
	// The service's schema first, so that the effect table gets its
	// handled_at column before anything is handled.
	if err := env.Service(ctx, map[string]string{"EFFECTIVELY_DATABASE_URL": s.file}, "migrate"); err != nil {
		return nil, err
	}
	db, err := openSQLite(ctx, env, s.file)
	if err != nil {
		return nil, err
	}
	s.db = db
	if _, err := db.ExecContext(ctx, `DROP TABLE reminders`); err != nil {
		return nil, fmt.Errorf("timestamp the reminders: %w", err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE reminders (appointment_id TEXT NOT NULL, starts_at TEXT NOT NULL, event_id TEXT NOT NULL, `+HandledAtColumn("sqlite")+`)`); err != nil {
		return nil, fmt.Errorf("timestamp the reminders: %w", err)
	}
	if err := sqlite.InitializePubSubSchema(ctx, db, ""); err != nil {
		return nil, fmt.Errorf("transport schema: %w", err)
	}
	return s, nil
}

// openSQLite opens file as the framework does, closed after the run.
func openSQLite(ctx context.Context, env *Env, file string) (*sqlx.DB, error) {
	db, err := sqlite.Open(ctx, file, sqlite.OpenConfig{})
	if err != nil {
		return nil, err
	}
	env.Cleanup(func(context.Context) error { return db.Close() })
	return db, nil
}

func (s *sqliteService) Feed(ctx context.Context, msgs []Message) error {
	return insertBatches(ctx, s.db, sqliteMessagesInsert, msgs)
}

// insertBatches runs insert(id, body) for each message, 500 to a
// transaction.
func insertBatches(ctx context.Context, db *sqlx.DB, insert string, msgs []Message) error {
	for len(msgs) > 0 {
		n := min(500, len(msgs))
		err := inTx(ctx, db, func(tx *sqlx.Tx) error {
			for _, m := range msgs[:n] {
				if _, err := tx.ExecContext(ctx, insert, m.ID, string(m.Body)); err != nil {
					return fmt.Errorf("insert %s: %w", m.ID, err)
				}
			}
			return nil
		})
		if err != nil {
			return err
		}
		msgs = msgs[n:]
	}
	return nil
}

// inTx runs fn in a transaction of db, committed when fn returns nil and
// rolled back otherwise.
func inTx(ctx context.Context, db *sqlx.DB, fn func(tx *sqlx.Tx) error) error {
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin: %w", err)
	}
	if err := fn(tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

func (s *sqliteService) Send(ctx context.Context, m Message) error {
	_, err := s.db.ExecContext(ctx, sqliteMessagesInsert, m.ID, string(m.Body))
	return err
}

func (s *sqliteService) Start(ctx context.Context) (*Process, error) {
	return s.env.StartService(ctx, serviceVars("sqlite", s.file, s.config))
}

func (s *sqliteService) Effects() *EffectTable {
	return &EffectTable{DB: s.db, Table: "reminders", EventColumn: "event_id", Prefix: s.env.ID}
}

// The raw limit's tables and its child's variables.
const (
	rawSchema = `CREATE TABLE bench_processed (source TEXT NOT NULL, event_id TEXT NOT NULL, PRIMARY KEY (source, event_id));
CREATE TABLE bench_reminders (appointment_id TEXT NOT NULL, starts_at TEXT NOT NULL, event_id TEXT NOT NULL, ` + handledAtSQLite + `)`

	envRawFile     = "EFFECTIVELY_BENCH_SQLITE_FILE"
	envRawMessages = "EFFECTIVELY_BENCH_MESSAGES"
	rawBatch       = 100
)

// sqliteRaw is the file's raw limit, written by a child.
type sqliteRaw struct {
	env  *Env
	file string
	msgs string // the file of messages the child reads
	db   *sqlx.DB
}

func measureSQLiteRaw(ctx context.Context, env *Env) (Result, error) {
	r := &sqliteRaw{env: env, file: filepath.Join(env.Dir, "raw.db"), msgs: filepath.Join(env.Dir, "messages.jsonl")}
	db, err := openSQLite(ctx, env, r.file)
	if err != nil {
		return Result{}, err
	}
	r.db = db
	if _, err := db.ExecContext(ctx, rawSchema); err != nil {
		return Result{}, fmt.Errorf("raw schema: %w", err)
	}
	return Drain(ctx, env, r)
}

// Feed writes the messages to a file, one body a line, for the child.
func (r *sqliteRaw) Feed(_ context.Context, msgs []Message) error {
	f, err := os.Create(r.msgs)
	if err != nil {
		return fmt.Errorf("messages file: %w", err)
	}
	w := bufio.NewWriter(f)
	for _, m := range msgs {
		_, _ = w.Write(m.Body)
		_ = w.WriteByte('\n')
	}
	if err := w.Flush(); err != nil {
		_ = f.Close()
		return fmt.Errorf("messages file: %w", err)
	}
	return f.Close()
}

func (r *sqliteRaw) Start(ctx context.Context) (*Process, error) {
	return r.env.StartChild(ctx, "raw", map[string]string{envRawFile: r.file, envRawMessages: r.msgs})
}

func (r *sqliteRaw) Effects() *EffectTable {
	return &EffectTable{DB: r.db, Table: "bench_reminders", EventColumn: "event_id", Prefix: r.env.ID}
}

// sqliteRawMain is the raw limit's child: once begun, it writes every
// message of the file, 100 to a transaction: the dedup insert, and the
// business insert when the event is new. Then it waits to be stopped.
func sqliteRawMain(ctx context.Context, c *ChildEnv) error {
	db, err := sqlite.Open(ctx, c.Getenv(envRawFile), sqlite.OpenConfig{})
	if err != nil {
		return err
	}
	defer db.Close()
	bodies, err := readLines(c.Getenv(envRawMessages))
	if err != nil {
		return err
	}
	c.Ready()
	if err := c.WaitBegin(ctx); err != nil {
		return nil // stopped before it began
	}
	for len(bodies) > 0 {
		n := min(rawBatch, len(bodies))
		if err := rawBatchTx(ctx, db, bodies[:n]); err != nil {
			return err
		}
		bodies = bodies[n:]
	}
	<-ctx.Done()
	return nil
}

func rawBatchTx(ctx context.Context, db *sqlx.DB, bodies [][]byte) error {
	return inTx(ctx, db, func(tx *sqlx.Tx) error {
		for _, b := range bodies {
			var ev cloudEvent
			if err := json.Unmarshal(b, &ev); err != nil {
				return fmt.Errorf("decode: %w", err)
			}
			res, err := tx.ExecContext(ctx, `INSERT INTO bench_processed (source, event_id) VALUES (?, ?) ON CONFLICT DO NOTHING`, ev.Source, ev.ID)
			if err != nil {
				return fmt.Errorf("dedup insert: %w", err)
			}
			if n, err := res.RowsAffected(); err != nil || n == 0 {
				continue // a duplicate
			}
			if _, err := tx.ExecContext(ctx, `INSERT INTO bench_reminders (appointment_id, starts_at, event_id) VALUES (?, ?, ?)`,
				ev.Data.AppointmentID, ev.Data.StartsAt.UTC().Format("2006-01-02T15:04:05Z07:00"), ev.ID); err != nil {
				return fmt.Errorf("insert: %w", err)
			}
		}
		return nil
	})
}

// readLines returns the lines of the file at path.
func readLines(path string) ([][]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	defer f.Close()
	var lines [][]byte
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, append([]byte(nil), sc.Bytes()...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	if len(lines) == 0 {
		return nil, errors.New("messages: the file is empty")
	}
	return lines, nil
}
