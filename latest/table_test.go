package latest_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/latest"
)

// viewDDL creates the projection of the tests: one row per appointment,
// with the sequence and the id of the event whose state it holds.
const viewDDL = `CREATE TABLE appointment_view (
	appointment_id TEXT PRIMARY KEY,
	seq BIGINT NOT NULL,
	status TEXT NOT NULL,
	event_id TEXT NOT NULL
)`

var viewConfig = latest.Config{
	Table:   "appointment_view",
	Key:     []string{"appointment_id"},
	Version: "seq",
	Columns: []string{"status", "event_id"},
}

// databases runs test on SQLite and on PostgreSQL (a schema of the
// test's own), each with the view's table created.
func databases(t *testing.T, test func(t *testing.T, db *sqlx.DB)) {
	t.Helper()
	for name, open := range map[string]func(testing.TB) *sqlx.DB{
		"SQLite":     testenv.SQLite,
		"PostgreSQL": testenv.Postgres,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			db := open(t)
			_, err := db.Exec(viewDDL)
			require.NoError(t, err)
			test(t, db)
		})
	}
}

type viewRow struct {
	Seq     int64  `db:"seq"`
	Status  string `db:"status"`
	EventID string `db:"event_id"`
}

func readView(t *testing.T, db *sqlx.DB, id string) viewRow {
	t.Helper()
	var r viewRow
	require.NoError(t, db.Get(&r, db.Rebind(`SELECT seq, status, event_id FROM appointment_view WHERE appointment_id = ?`), id))
	return r
}

func newView(t *testing.T) *latest.Table {
	t.Helper()
	view, err := latest.New(viewConfig)
	require.NoError(t, err)
	return view
}

func upsert(ctx context.Context, t *testing.T, view *latest.Table, conn sqlx.ExtContext, seq int64, status string) bool {
	t.Helper()
	applied, err := view.Upsert(ctx, conn, latest.Row{
		Key:    []any{"a-1"},
		Stamp:  latest.Stamp{Subject: "a-1", Seq: seq},
		Values: []any{status, status},
	})
	require.NoError(t, err)
	return applied
}

// TestUpsert writes one row's states out of order, straight on the
// database: only a greater sequence replaces the stored state.
func TestUpsert(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sqlx.DB) {
		ctx := t.Context()
		view := newView(t)
		require.True(t, upsert(ctx, t, view, db, 7, "seven"), "a first row is inserted")
		require.True(t, upsert(ctx, t, view, db, 9, "nine"), "a newer state replaces it")
		require.False(t, upsert(ctx, t, view, db, 8, "eight"), "an older state does not")
		require.False(t, upsert(ctx, t, view, db, 9, "nine again"), "an equal sequence is not newer")
		require.Equal(t, viewRow{Seq: 9, Status: "nine", EventID: "nine"}, readView(t, db, "a-1"))
		require.True(t, upsert(ctx, t, view, db, 10, "ten"))
		require.Equal(t, viewRow{Seq: 10, Status: "ten", EventID: "ten"}, readView(t, db, "a-1"))
	})
}

// TestUpsertCompositeKey keys the rows by two columns: each key keeps its
// own latest state.
func TestUpsertCompositeKey(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sqlx.DB) {
		ctx := t.Context()
		_, err := db.Exec(`CREATE TABLE tenant_view (tenant TEXT NOT NULL, id TEXT NOT NULL, "version" BIGINT NOT NULL, "order" TEXT NOT NULL, PRIMARY KEY (tenant, id))`)
		require.NoError(t, err)
		view, err := latest.New(latest.Config{Table: "tenant_view", Key: []string{"tenant", "id"}, Version: "version", Columns: []string{"order"}})
		require.NoError(t, err)
		put := func(tenant string, seq int64, order string) bool {
			applied, err := view.Upsert(ctx, db, latest.Row{Key: []any{tenant, "x"}, Stamp: latest.Stamp{Subject: tenant + "/x", Seq: seq}, Values: []any{order}})
			require.NoError(t, err)
			return applied
		}
		require.True(t, put("t1", 5, "t1-5"))
		require.True(t, put("t2", 2, "t2-2"), "another key is another row")
		require.False(t, put("t1", 4, "t1-4"))
		var orders []string
		require.NoError(t, db.Select(&orders, `SELECT "order" FROM tenant_view ORDER BY tenant`))
		require.Equal(t, []string{"t1-5", "t2-2"}, orders)
	})
}

// TestUpsertInTransaction writes through the transaction it is given: a
// rollback takes the write back.
func TestUpsertInTransaction(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sqlx.DB) {
		ctx := t.Context()
		view := newView(t)
		require.True(t, upsert(ctx, t, view, db, 7, "seven"))
		tx, err := db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.True(t, upsert(ctx, t, view, tx, 9, "nine"))
		require.NoError(t, tx.Rollback())
		require.Equal(t, viewRow{Seq: 7, Status: "seven", EventID: "seven"}, readView(t, db, "a-1"))
	})
}

// TestUpsertRefuses refuses a stamp that cannot be ordered and a row that
// does not fit the table, before any statement.
func TestUpsertRefuses(t *testing.T) {
	t.Parallel()
	databases(t, func(t *testing.T, db *sqlx.DB) {
		ctx := t.Context()
		view := newView(t)
		for name, tc := range map[string]struct {
			row  latest.Row
			code framework.Code // empty: a plain error
		}{
			"NoSeq":       {row: latest.Row{Key: []any{"a-1"}, Stamp: latest.Stamp{Subject: "a-1"}, Values: []any{"s", "e"}}, code: latest.CodeUnsequenced},
			"NoSubject":   {row: latest.Row{Key: []any{"a-1"}, Stamp: latest.Stamp{Seq: 3}, Values: []any{"s", "e"}}, code: latest.CodeUnsequenced},
			"KeyCount":    {row: latest.Row{Key: []any{"a-1", "b"}, Stamp: latest.Stamp{Subject: "a-1", Seq: 3}, Values: []any{"s", "e"}}},
			"ValuesCount": {row: latest.Row{Key: []any{"a-1"}, Stamp: latest.Stamp{Subject: "a-1", Seq: 3}, Values: []any{"s"}}},
		} {
			applied, err := view.Upsert(ctx, db, tc.row)
			require.Error(t, err, name)
			require.False(t, applied, name)
			require.Equal(t, tc.code != "", framework.IsPermanent(err), name)
			if tc.code != "" {
				require.Equal(t, tc.code, framework.CodeOf(err), name)
			}
		}
		var n int
		require.NoError(t, db.Get(&n, `SELECT count(*) FROM appointment_view`))
		require.Zero(t, n)
	})
}

func TestNewRefusesBadConfig(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		mutate func(*latest.Config)
		field  string
	}{
		"NoTable":      {func(c *latest.Config) { c.Table = "" }, "Config.Table"},
		"UpperCase":    {func(c *latest.Config) { c.Table = "Appointment_view" }, "Config.Table"},
		"Injection":    {func(c *latest.Config) { c.Table = `t"; DROP TABLE x; --` }, "Config.Table"},
		"Schema":       {func(c *latest.Config) { c.Table = "public.appointment_view" }, "Config.Table"},
		"LeadingDigit": {func(c *latest.Config) { c.Version = "1seq" }, "Config.Version"},
		"TooLong":      {func(c *latest.Config) { c.Table = strings.Repeat("a", 64) }, "Config.Table"},
		"NoKey":        {func(c *latest.Config) { c.Key = nil }, "Config.Key"},
		"BadKey":       {func(c *latest.Config) { c.Key = []string{"id", "x y"} }, "Config.Key[1]"},
		"NoVersion":    {func(c *latest.Config) { c.Version = "" }, "Config.Version"},
		"BadColumn":    {func(c *latest.Config) { c.Columns = []string{"status", ""} }, "Config.Columns[1]"},
		"VersionInKey": {func(c *latest.Config) { c.Version = "appointment_id" }, "Config.Version"},
		"ColumnTwice":  {func(c *latest.Config) { c.Columns = []string{"status", "status"} }, "Config.Columns[1]"},
		"ColumnIsKey":  {func(c *latest.Config) { c.Columns = []string{"appointment_id"} }, "Config.Columns[0]"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := viewConfig
			cfg.Key = append([]string(nil), cfg.Key...)
			cfg.Columns = append([]string(nil), cfg.Columns...)
			tc.mutate(&cfg)
			_, err := latest.New(cfg)
			require.ErrorContains(t, err, tc.field+":")
		})
	}
	for _, name := range []string{"a", "_x", "appointment_view_2", strings.Repeat("a", latest.MaxIdentifierBytes)} {
		cfg := viewConfig
		cfg.Table = name
		_, err := latest.New(cfg)
		require.NoError(t, err, name)
	}
}

func TestSQL(t *testing.T) {
	t.Parallel()
	require.Equal(t,
		`INSERT INTO "appointment_view" ("appointment_id", "seq", "status", "event_id") VALUES (?, ?, ?, ?)`+
			` ON CONFLICT ("appointment_id") DO UPDATE SET "seq" = excluded."seq", "status" = excluded."status", "event_id" = excluded."event_id"`+
			` WHERE excluded."seq" > "appointment_view"."seq"`,
		newView(t).SQL())
}
