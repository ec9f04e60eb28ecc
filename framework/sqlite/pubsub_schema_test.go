package sqlite

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
)

// oldestSQLite is the oldest SQLite that docs/transports.md says a program
// publishing by hand may use: Debian 12's sqlite3 (and Python's sqlite3
// module there). Under CI=true the documented statement must run on it.
const oldestSQLite = "3.40"

// oldPubSubSchema is the Pub/Sub's schema as releases before the
// julianday default created it: created_at defaults to
// unixepoch('subsec'), which SQLite before 3.42 cannot compute.
var oldPubSubSchema = []string{
	`CREATE TABLE IF NOT EXISTS {p}pubsub_messages (
	"offset"   INTEGER PRIMARY KEY AUTOINCREMENT,
	topic      TEXT    NOT NULL,
	uuid       TEXT    NOT NULL DEFAULT '',
	payload    BLOB    NOT NULL,
	metadata   TEXT    NOT NULL DEFAULT '{}',
	created_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER))
)`,
	`CREATE INDEX IF NOT EXISTS {p}pubsub_messages_topic_offset ON {p}pubsub_messages (topic, "offset")`,
	`CREATE TABLE IF NOT EXISTS {p}pubsub_groups (
	topic          TEXT    NOT NULL,
	consumer_group TEXT    NOT NULL,
	claimed_offset INTEGER NOT NULL DEFAULT 0,
	created_at     INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
	PRIMARY KEY (topic, consumer_group)
) WITHOUT ROWID`,
	`CREATE TABLE IF NOT EXISTS {p}pubsub_leases (
	topic          TEXT    NOT NULL,
	consumer_group TEXT    NOT NULL,
	"offset"       INTEGER NOT NULL,
	deliveries     INTEGER NOT NULL,
	locked_until   INTEGER NOT NULL,
	PRIMARY KEY (topic, consumer_group, "offset")
) WITHOUT ROWID`,
	`CREATE INDEX IF NOT EXISTS {p}pubsub_leases_due ON {p}pubsub_leases (topic, consumer_group, locked_until)`,
}

// createOldPubSubSchema creates the tables the way an earlier release did,
// with messages at offsets 3 and 4 of a sequence that reached 5 (the
// others acknowledged by every group and deleted), and a group.
func createOldPubSubSchema(t *testing.T, db *sqlx.DB, prefix string) {
	t.Helper()
	for _, stmt := range oldPubSubSchema {
		_, err := db.Exec(strings.ReplaceAll(stmt, "{p}", prefix))
		require.NoError(t, err)
	}
	for i := 1; i <= 5; i++ {
		_, err := db.Exec(`INSERT INTO `+prefix+`pubsub_messages (topic, uuid, payload, metadata, created_at) VALUES (?, ?, ?, '{}', ?)`,
			"t", fmt.Sprintf("m-%d", i), []byte(fmt.Sprintf("payload %d", i)), 1000+i)
		require.NoError(t, err)
	}
	_, err := db.Exec(`DELETE FROM ` + prefix + `pubsub_messages WHERE "offset" IN (1, 2, 5)`)
	require.NoError(t, err)
	_, err = db.Exec(`INSERT INTO ` + prefix + `pubsub_groups (topic, consumer_group, claimed_offset, created_at) VALUES ('t', 'g', 5, 999)`)
	require.NoError(t, err)
}

func tableSQL(t *testing.T, db *sqlx.DB, name string) string {
	t.Helper()
	var ddl string
	require.NoError(t, db.Get(&ddl, `SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?`, name))
	return ddl
}

// TestPubSubSchemaUpgrade checks that the tables of an earlier release are
// rebuilt with a created_at default every SQLite computes, their rows,
// indexes and offset sequence kept.
func TestPubSubSchemaUpgrade(t *testing.T) {
	t.Parallel()
	for _, prefix := range []string{"", "fx_"} {
		t.Run("Prefix"+prefix, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := openPubSubTestDB(t)
			createOldPubSubSchema(t, db, prefix)

			require.NoError(t, InitializePubSubSchema(ctx, db, prefix))
			for _, table := range []string{PubSubMessagesTable, PubSubGroupsTable} {
				ddl := tableSQL(t, db, prefix+table)
				require.NotContains(t, ddl, "unixepoch", table)
				require.Contains(t, ddl, nowMillis, table)
			}
			type row struct {
				Offset    int64  `db:"offset"`
				UUID      string `db:"uuid"`
				Payload   []byte `db:"payload"`
				CreatedAt int64  `db:"created_at"`
			}
			var rows []row
			require.NoError(t, db.Select(&rows, `SELECT "offset", uuid, payload, created_at FROM `+prefix+`pubsub_messages ORDER BY "offset"`))
			require.Equal(t, []row{{3, "m-3", []byte("payload 3"), 1003}, {4, "m-4", []byte("payload 4"), 1004}}, rows)
			var claimed, groupCreated int64
			require.NoError(t, db.QueryRow(`SELECT claimed_offset, created_at FROM `+prefix+`pubsub_groups WHERE topic = 't' AND consumer_group = 'g'`).Scan(&claimed, &groupCreated))
			require.Equal(t, []int64{5, 999}, []int64{claimed, groupCreated})
			var indexes []string
			require.NoError(t, db.Select(&indexes, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, prefix+PubSubMessagesTable))
			require.Equal(t, []string{prefix + "pubsub_messages_topic_offset"}, indexes)
			// The leases' index on locked_until is gone: each claim, ack
			// and renewal wrote it beside the primary key.
			indexes = nil
			require.NoError(t, db.Select(&indexes, `SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL`, prefix+PubSubLeasesTable))
			require.Empty(t, indexes)

			// The next offset follows the old sequence, not the highest
			// offset left: group g, which claimed up to 5, gets it.
			res, err := db.Exec(`INSERT INTO ` + prefix + `pubsub_messages (topic, payload) VALUES ('t', x'00')`)
			require.NoError(t, err)
			next, err := res.LastInsertId()
			require.NoError(t, err)
			require.EqualValues(t, 6, next)

			// Once upgraded, nothing is rebuilt again.
			before := tableSQL(t, db, prefix+PubSubMessagesTable)
			require.NoError(t, InitializePubSubSchema(ctx, db, prefix))
			require.Equal(t, before, tableSQL(t, db, prefix+PubSubMessagesTable))
			var n int
			require.NoError(t, db.Get(&n, `SELECT count(*) FROM `+prefix+`pubsub_messages`))
			require.Equal(t, 3, n)
		})
	}
}

// TestPubSubHandInsertSQLiteCLI runs the INSERT that docs/transports.md
// shows, exactly as it is written there, through the sqlite3 command-line
// program (the oldest SQLite the docs claim, under CI=true) against a file
// the framework created, then consumes the message.
func TestPubSubHandInsertSQLiteCLI(t *testing.T) {
	t.Parallel()
	cli := sqliteCLI(t)
	stmt := documentedHandInsert(t)

	for _, tc := range []struct {
		name   string
		create func(t *testing.T, db *sqlx.DB)
	}{
		{"NewFile", func(t *testing.T, db *sqlx.DB) {
			require.NoError(t, InitializePubSubSchema(context.Background(), db, ""))
		}},
		{"UpgradedFile", func(t *testing.T, db *sqlx.DB) {
			createOldPubSubSchema(t, db, "")
			require.NoError(t, InitializePubSubSchema(context.Background(), db, ""))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "effectively.db")
			db, err := Open(ctx, path, OpenConfig{})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, db.Close()) })
			// The framework's own tables share the file: the program's
			// SQLite must read their schema too.
			require.NoError(t, migrate.Up(ctx, db, migrate.Config{}))
			tc.create(t, db)
			sub, err := NewSubscriber(db, SubscriberConfig{ConsumerGroup: "notifications.remind-on-appointment-booked", PollInterval: 10 * time.Millisecond})
			require.NoError(t, err)
			t.Cleanup(func() { require.NoError(t, sub.Close()) })
			const topic = "appointments.appointment.booked"
			require.NoError(t, sub.SubscribeInitialize(topic))

			before := time.Now().UnixMilli()
			runSQLiteCLI(t, cli, path, stmt)
			after := time.Now().UnixMilli()

			var createdAt int64
			require.NoError(t, db.Get(&createdAt, `SELECT created_at FROM pubsub_messages WHERE uuid = 'evt-1'`))
			// Unix milliseconds, like the framework's own inserts (a float
			// rounding may cost the last millisecond).
			require.GreaterOrEqual(t, createdAt, before-1)
			require.LessOrEqual(t, createdAt, after)

			ch, err := sub.Subscribe(ctx, topic)
			require.NoError(t, err)
			msg := receive(t, ch)
			env, err := driver.DecodeMessage(msg, 0)
			require.NoError(t, err)
			require.Equal(t, framework.Key{Source: "appointments", ID: "evt-1"}, env.Key())
			require.Equal(t, framework.ContentType, msg.Metadata.Get(framework.MetadataContentType))
			msg.Ack()
		})
	}
}

// sqliteCLI returns the path of the sqlite3 program, a real part of the
// test: without it the test fails (make test installs Debian's through
// scripts/services.sh). Under CI=true it must be the oldest SQLite the
// docs claim.
func sqliteCLI(t *testing.T) string {
	t.Helper()
	ci := os.Getenv("CI") == "true"
	path, err := exec.LookPath("sqlite3")
	if err != nil {
		t.Fatalf("the sqlite3 program is missing: run the tests with make test, or install Debian's sqlite3 package")
	}
	out, err := exec.Command(path, "--version").Output()
	require.NoError(t, err)
	version := strings.Fields(string(out))[0]
	t.Logf("sqlite3 %s", version)
	if minor(t, version) > minor(t, oldestSQLite+".0") {
		if ci {
			t.Fatalf("under CI=true the documented INSERT must run on SQLite %s, the oldest the docs claim; sqlite3 is %s", oldestSQLite, version)
		}
		t.Logf("sqlite3 %s is newer than %s, the oldest the docs claim", version, oldestSQLite)
	}
	return path
}

// minor returns the minor number of a SQLite version such as 3.40.1.
func minor(t *testing.T, version string) int {
	t.Helper()
	parts := strings.Split(version, ".")
	require.GreaterOrEqual(t, len(parts), 2, "version %q", version)
	n, err := strconv.Atoi(parts[1])
	require.NoError(t, err, "version %q", version)
	return n
}

// handInsertRE finds the hand INSERT in docs/transports.md.
var handInsertRE = regexp.MustCompile("(?s)```sql\n(INSERT INTO pubsub_messages .*?)```")

// documentedHandInsert returns the hand INSERT of docs/transports.md.
func documentedHandInsert(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "transports.md"))
	require.NoError(t, err)
	m := handInsertRE.FindSubmatch(doc)
	require.NotNil(t, m, "no ```sql block starting with INSERT INTO pubsub_messages in docs/transports.md")
	return string(m[1])
}

// runSQLiteCLI runs stmt on the file path with the sqlite3 program, with a
// busy timeout, as the docs tell another program to.
func runSQLiteCLI(t *testing.T, cli, path, stmt string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cli, "-bail", path)
	cmd.Stdin = strings.NewReader(".timeout 30000\n" + stmt)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	require.NoError(t, cmd.Run(), "sqlite3: %s", out.String())
	require.Empty(t, strings.TrimSpace(out.String()))
}
