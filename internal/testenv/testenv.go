// Package testenv gives tests real databases: a fresh SQLite file, or a
// fresh schema on the PostgreSQL server named by
// EFFECTIVELY_TEST_POSTGRES_URL. Under CI=true a missing server fails the
// test; elsewhere the test is skipped with a hint.
package testenv

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"path/filepath"
	"testing"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // registers the "pgx" driver
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/sqlite"
)

// PostgresURLVar names the variable that points tests at PostgreSQL.
const PostgresURLVar = "EFFECTIVELY_TEST_POSTGRES_URL"

// AMQPURLVar names the variable that points tests at RabbitMQ.
const AMQPURLVar = "EFFECTIVELY_TEST_AMQP_URL"

// AMQPBenchURLVar names the variable that points the benchmark at a
// RabbitMQ virtual host of its own (scripts/services.sh makes one): the
// benchmark runs the example service, whose queue and exchange names are
// fixed, and must not share them with the example's tests.
const AMQPBenchURLVar = "EFFECTIVELY_TEST_AMQP_BENCH_URL"

// AMQPSmokeURLVar names the variable that points TestSmoke (in
// internal/tools/bench) at a second RabbitMQ virtual host of the
// benchmark's own (scripts/services.sh makes one), so that it runs the
// benchmark's RabbitMQ scenarios in two lanes at once. Unset, they run in
// one lane.
const AMQPSmokeURLVar = "EFFECTIVELY_TEST_AMQP_SMOKE_URL"

// BenchAMQPURL returns the benchmark's broker: the URL in AMQPBenchURLVar,
// or else the one in AMQPURLVar.
func BenchAMQPURL() string {
	if u := os.Getenv(AMQPBenchURLVar); u != "" {
		return u
	}
	return os.Getenv(AMQPURLVar)
}

// Require returns the value of the environment variable name, which must
// name a test server. When it is unset the test fails under CI=true and
// is skipped elsewhere.
func Require(t testing.TB, name string) string {
	t.Helper()
	v := os.Getenv(name)
	if v != "" {
		return v
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("%s is not set: under CI=true the server is required (run the tests with make test)", name)
	}
	t.Skipf("%s is not set: run the tests with make test to start the server", name)
	return ""
}

// SQLitePath returns the path of a new SQLite file in the test's temporary
// folder.
func SQLitePath(t testing.TB) string {
	t.Helper()
	return filepath.Join(t.TempDir(), "test.db")
}

// SQLite opens a new SQLite file the way the framework does and closes it
// when the test ends.
func SQLite(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := sqlite.Open(context.Background(), SQLitePath(t), sqlite.OpenConfig{})
	if err != nil {
		t.Fatalf("open sqlite: %v", err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// PostgresURL creates a schema of the test's own on the test server,
// dropped when the test ends, and returns a URL whose connections use it.
func PostgresURL(t testing.TB) string {
	t.Helper()
	base := Require(t, PostgresURLVar)
	schema := "t_" + randomHex(8)
	admin, err := sqlx.Open("pgx", base)
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	defer admin.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
		t.Fatalf("create schema: %v", err)
	}
	t.Cleanup(func() {
		db, err := sqlx.Open("pgx", base)
		if err != nil {
			return
		}
		defer db.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, _ = db.ExecContext(ctx, "DROP SCHEMA "+schema+" CASCADE")
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatalf("parse %s: %v", PostgresURLVar, err)
	}
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String()
}

// Postgres opens a pool on a schema of the test's own (see PostgresURL)
// and closes it when the test ends.
func Postgres(t testing.TB) *sqlx.DB {
	t.Helper()
	db, err := sqlx.Open("pgx", PostgresURL(t))
	if err != nil {
		t.Fatalf("open postgres: %v", err)
	}
	db.SetMaxOpenConns(20)
	t.Cleanup(func() { _ = db.Close() })
	if err := db.Ping(); err != nil {
		t.Fatalf("ping postgres: %v", err)
	}
	return db
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Missing reports a missing prerequisite of a test: under CI=true the test
// fails, since CI must run everything; elsewhere it is skipped with why.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("under CI=true nothing is skipped: "+format, args...)
	}
	t.Skipf(format, args...)
}
