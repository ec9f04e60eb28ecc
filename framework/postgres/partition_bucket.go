package postgres

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"time"
	"unicode/utf16"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/jsonescape"
)

// Partitions on PostgreSQL: each messages table has a column of ours,
// bucketColumn, that holds each row's bucket (driver.Bucket of its
// CloudEvent's partition key, driver.PartitionKey of its subject and id).
// The transport's publisher writes it. A row inserted without it (by hand,
// by a watermill-sql publisher of another service, or before the column
// existed) leaves it NULL, and its bucket is then computed from its payload
// by bucketFunction, a SQL function that hashes as driver.Bucket does: a
// partition's rows are those whose bucketExpr, modulo the partitions, is
// the partition. A consumer of n partitions reads through an expression
// index of its own n (bucketIndex), created when it first subscribes.

const (
	// bucketColumn is the column of each messages table that holds the
	// bucket of a row published by the transport; NULL in other rows.
	bucketColumn = "bucket"
	// bucketFunction names the SQL function that computes the bucket of a
	// payload (see bucketFunctionSQL).
	bucketFunction = "effectively_bucket"
	// bucketLock names the advisory lock under which the bucket column and
	// function are added, and (with the table and the partition count)
	// those under which the partitions' indexes are built.
	bucketLock = "effectively_bucket"
)

// bucketExpr is a row's bucket: the column when set, else the payload's.
// A partition's index and its reads name it alike, so that PostgreSQL
// matches them.
const bucketExpr = `COALESCE(` + bucketColumn + `, ` + bucketFunction + `(payload::text))`

// bucketFunctionSQL creates bucketFunction: the bucket of a payload, as
// payloadBucket computes it in Go. The key is the payload's subject when it
// is a non-empty string, else its id when a string, else empty; its UTF-8
// bytes are hashed with 32-bit FNV-1a (driver.Bucket), modulo
// driver.PartitionBuckets. A payload that is not a JSON object (or that
// PostgreSQL cannot read as jsonb) is in bucket 0. IMMUTABLE, so that an
// index may use it.
var bucketFunctionSQL = `CREATE OR REPLACE FUNCTION ` + bucketFunction + `(payload text) RETURNS smallint
	LANGUAGE plpgsql IMMUTABLE STRICT AS $$
	DECLARE
		doc jsonb;
		key text := '';
		bytes bytea;
		h bigint := 2166136261;
	BEGIN
		BEGIN
			doc := payload::jsonb;
		EXCEPTION WHEN others THEN
			RETURN 0;
		END;
		IF jsonb_typeof(doc) IS DISTINCT FROM 'object' THEN
			RETURN 0;
		END IF;
		IF jsonb_typeof(doc -> 'subject') = 'string' AND doc ->> 'subject' <> '' THEN
			key := doc ->> 'subject';
		ELSIF jsonb_typeof(doc -> 'id') = 'string' THEN
			key := doc ->> 'id';
		END IF;
		bytes := convert_to(key, 'UTF8');
		FOR i IN 0 .. length(bytes) - 1 LOOP
			h := ((h # get_byte(bytes, i)) * 16777619) % 4294967296;
		END LOOP;
		RETURN (h % ` + strconv.Itoa(driver.PartitionBuckets) + `)::smallint;
	END $$`

// payloadBucket returns the bucket of a payload (see bucketFunctionSQL):
// driver.Bucket of the partition key of the CloudEvent it holds.
func payloadBucket(payload []byte) int {
	if t := bytes.TrimLeft(payload, " \t\r\n"); len(t) == 0 || t[0] != '{' {
		return 0
	}
	// A map, not a struct: encoding/json matches a struct's fields
	// whatever their case, jsonb only the exact name.
	var doc map[string]json.RawMessage
	if err := json.Unmarshal(payload, &doc); err != nil || jsonbRefuses(payload) {
		return 0
	}
	return driver.Bucket(driver.PartitionKey(jsonString(doc["subject"]), jsonString(doc["id"])))
}

// jsonbRefuses reports whether payload, valid JSON, holds an escape that
// PostgreSQL's jsonb refuses, in any string: \u0000, or a surrogate
// (\ud800 to \udfff) that is not a high one followed by a low one. Go
// reads those (NUL, U+FFFD), PostgreSQL cannot, so bucketFunction puts
// such a payload in bucket 0, and so must payloadBucket.
func jsonbRefuses(payload []byte) bool {
	for i := 0; i < len(payload); i++ {
		if payload[i] != '\\' { // outside strings, valid JSON has none
			continue
		}
		r, n := jsonescape.Unescape(payload[i:])
		switch {
		case n == 0:
			return false // cannot be: payload is valid JSON
		case r == 0 || utf16.IsSurrogate(r): // a pair is one rune above U+FFFF
			return true
		}
		i += n - 1
	}
	return false
}

// jsonString returns the string that raw holds, or "" when it holds
// another value.
func jsonString(raw json.RawMessage) string {
	var s string
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &s) != nil {
		return ""
	}
	return s
}

// ensureBucket adds the bucket column to topic's messages table and, with
// function, creates bucketFunction, unless they exist, in a transaction
// of its own under an advisory lock. The column is NULL in the rows there
// (their bucket is computed from their payload).
func ensureBucket(ctx context.Context, db *sqlx.DB, cfg TransportConfig, topic string, function bool) error {
	table := MessagesTable(cfg.TablePrefix, topic)
	tx, err := db.BeginTxx(ctx, nil)
	if err != nil {
		return fmt.Errorf("bucket column of %s: begin: %w", topic, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtextextended('`+bucketLock+`', 0))`); err != nil {
		return fmt.Errorf("bucket column of %s: lock: %w", topic, err)
	}
	var hasColumn, hasFunction bool
	err = tx.QueryRowContext(ctx, `SELECT
		EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = $1::text::regclass AND attname = $2 AND NOT attisdropped),
		to_regprocedure($3) IS NOT NULL`,
		table, bucketColumn, bucketFunction+"(text)").Scan(&hasColumn, &hasFunction)
	if err != nil {
		return fmt.Errorf("bucket column of %s: %w", topic, err)
	}
	if hasColumn && (hasFunction || !function) {
		return nil
	}
	queries := []string{`SET LOCAL lock_timeout = ` + strconv.FormatInt(triggerLockTimeout.Milliseconds(), 10)}
	if function && !hasFunction {
		queries = append(queries, bucketFunctionSQL)
	}
	if !hasColumn {
		queries = append(queries, `ALTER TABLE `+table+` ADD COLUMN IF NOT EXISTS `+bucketColumn+` smallint`)
	}
	for _, q := range queries {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("bucket column of %s: %w", topic, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("bucket column of %s: commit: %w", topic, err)
	}
	return nil
}

// bucketIndex returns the name (unquoted) of the index through which the
// consumers of n partitions read topic's messages table.
func bucketIndex(prefix, topic string, n int) string {
	return identifier(identifier(prefix+"watermill_"+topic) + "_bucket_mod_" + strconv.Itoa(n))
}

// bucketIndexSQL returns the statement that builds topic's index for n
// partitions: a partition's rows, in the order they are read. An operator
// may run it ahead (it is built CONCURRENTLY: publishers do not wait).
func bucketIndexSQL(prefix, topic string, n int) string {
	return `CREATE INDEX CONCURRENTLY IF NOT EXISTS ` + quoteIdent(bucketIndex(prefix, topic, n)) +
		` ON ` + MessagesTable(prefix, topic) + ` ((` + bucketExpr + ` % ` + strconv.Itoa(n) + `), transaction_id, "offset")`
}

// errInvalidIndex says that a partitions' index exists but is invalid (a
// concurrent build that failed, or one under way elsewhere).
type errInvalidIndex struct{ name string }

func (e errInvalidIndex) Error() string {
	return fmt.Sprintf("index %s is invalid (a concurrent build failed, or is under way): drop it (DROP INDEX CONCURRENTLY) and subscribe again", e.name)
}

// ensureIndex builds topic's index for n partitions unless it exists, on
// a connection of its own (CREATE INDEX CONCURRENTLY runs outside a
// transaction) under a session advisory lock of the table and n, so that
// processes that subscribe at once build it once. It tries that lock
// every PollInterval rather than wait for it: the build waits for every
// transaction older than it, which must not be one waiting for the lock.
// A build cut short is dropped again.
func ensureIndex(ctx context.Context, db *sqlx.DB, cfg TransportConfig, topic string, n int, log *slog.Logger) (err error) {
	name := bucketIndex(cfg.TablePrefix, topic, n)
	conn, err := db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("index %s: connect: %w", name, err)
	}
	defer func() { _ = conn.Close() }()
	const key = `hashtextextended($1::text::regclass::oid::text || '/` + bucketLock + `/' || $2::int, 0)`
	table := MessagesTable(cfg.TablePrefix, topic)
	for locked := false; !locked; {
		if err := conn.QueryRowContext(ctx, `SELECT pg_try_advisory_lock(`+key+`)`, table, n).Scan(&locked); err != nil {
			spoil(conn) // the lock may be held
			return fmt.Errorf("index %s: lock: %w", name, err)
		}
		if locked {
			break
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("index %s: wait for its build elsewhere: %w", name, ctx.Err())
		case <-time.After(cfg.PollInterval):
		}
	}
	defer func() {
		unlockCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		if _, uerr := conn.ExecContext(unlockCtx, `SELECT pg_advisory_unlock(`+key+`)`, table, n); uerr != nil {
			spoil(conn) // ends the session, and its lock
		}
	}()
	var valid *bool
	err = conn.QueryRowContext(ctx, `SELECT (SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1))`, quoteIdent(name)).Scan(&valid)
	if err != nil {
		return fmt.Errorf("index %s: %w", name, err)
	}
	switch {
	case valid != nil && *valid:
		return nil
	case valid != nil:
		return errInvalidIndex{name: name}
	}
	start := time.Now()
	log.Info("postgres subscriber: building the partitions' index", slog.String("topic", topic), slog.String("index", name))
	if _, err := conn.ExecContext(ctx, bucketIndexSQL(cfg.TablePrefix, topic, n)); err != nil {
		dropCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		_, _ = conn.ExecContext(dropCtx, `DROP INDEX CONCURRENTLY IF EXISTS `+quoteIdent(name))
		return fmt.Errorf("index %s: %w", name, err)
	}
	log.Info("postgres subscriber: built the partitions' index", slog.String("topic", topic), slog.String("index", name),
		slog.Duration("took", time.Since(start)))
	return nil
}
