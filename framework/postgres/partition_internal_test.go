package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestBucketFunctionAgrees compares the bucket SQL computes from a
// payload with the one the publisher writes (payloadBucket, and
// driver.Bucket of the partition key), on many keys, multibyte ones
// included, and on payloads of every shape.
func TestBucketFunctionAgrees(t *testing.T) {
	t.Parallel()
	db, err := Open(context.Background(), testenv.PostgresURL(t), OpenConfig{MaxOpenConns: 2})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err = db.ExecContext(ctx, bucketFunctionSQL)
	require.NoError(t, err)

	keys := []string{
		"", "a", "appointment-1", "é", "日本語の件名", "🎉 party", "e\u0301", "ß≠ss", "\u00a0", `quote " and \ backslash`, "tab\tnew\nline",
		strings.Repeat("long-", 200), strings.Repeat("ü", 512),
	}
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []rune("abcXYZ019-_.:/ éüßøπλжщ中文字日本한국🎉😀\u0301")
	for range 2000 {
		k := make([]rune, r.IntN(40))
		for i := range k {
			k[i] = alphabet[r.IntN(len(alphabet))]
		}
		keys = append(keys, string(k))
	}
	var payloads []string
	var want []int
	for i, k := range keys {
		subject, err := json.Marshal(k)
		require.NoError(t, err)
		payloads = append(payloads, `{"specversion":"1.0","id":"id-`+strconv.Itoa(i)+`","subject":`+string(subject)+`,"data":{"n":1}}`)
		want = append(want, driver.Bucket(driver.PartitionKey(k, "id-"+strconv.Itoa(i))))
	}
	shapes := []string{
		`{"id":"only-id"}`,                       // no subject: the id
		`{"subject":"","id":"empty-subject"}`,    // an empty subject: the id
		`{"subject":5,"id":"numeric-subject"}`,   // a subject that is no string: the id
		`{"Subject":"case","id":"case-matters"}`, // names are exact
		`{"subject":"dup","subject":"last"}`,     // the last of twice
		`{"subject":"\u00e9\ud83c\udf89"}`,       // escapes
		`{}`, `{"id":7}`,                         // no key: the empty one
		`[1,2]`, `"text"`, `42`, `null`, `not json`, ``, // no object: bucket 0
		`  {"subject":"spaced"}  `,
		// What PostgreSQL's jsonb refuses, anywhere in the document: NUL
		// and unpaired surrogates. Bucket 0, as for any payload it
		// cannot read.
		`{"subject":"a\u0000b","id":"nul"}`,
		`{"subject":"ok","id":"nul-in-data","data":{"s":"\u0000"}}`,
		`{"subject":"\ud800","id":"lone-high"}`,
		`{"subject":"\udc00x","id":"lone-low"}`,
		`{"subject":"\ud83c\u0041","id":"high-then-other"}`,
		`{"subject":"a\\u0000b","id":"escaped-backslash"}`, // the text \u0000, no NUL
		`{"subject":"\u00000","id":"nul-then-digit"}`,
	}
	for _, p := range shapes {
		payloads = append(payloads, p)
		want = append(want, payloadBucket([]byte(p)))
	}
	require.Equal(t, 0, payloadBucket([]byte(`[1,2]`)))
	require.Equal(t, driver.Bucket("empty-subject"), payloadBucket([]byte(`{"subject":"","id":"empty-subject"}`)))

	var got []int
	require.NoError(t, db.SelectContext(ctx, &got, `SELECT `+bucketFunction+`(p) FROM unnest($1::text[]) WITH ORDINALITY AS t(p, i) ORDER BY i`, payloads))
	require.Len(t, got, len(payloads))
	for i := range payloads {
		require.Equal(t, want[i], got[i], "payload %q", payloads[i])
		if i < len(keys) {
			require.Equal(t, want[i], payloadBucket([]byte(payloads[i])), "Go, payload %q", payloads[i])
		}
	}
}

// indexScan is a node of EXPLAIN (FORMAT JSON)'s plan, with the index it
// scans.
type indexScan struct {
	Type            string      `json:"Node Type"`
	Relation        string      `json:"Relation Name"`
	Index           string      `json:"Index Name"`
	ActualRows      float64     `json:"Actual Rows"`
	Loops           float64     `json:"Actual Loops"`
	RemovedByFilter float64     `json:"Rows Removed by Filter"`
	Plans           []indexScan `json:"Plans"`
}

// scans returns the nodes of n's tree that read relation.
func (n indexScan) scans(relation string) []indexScan {
	var out []indexScan
	if n.Relation == relation {
		out = append(out, n)
	}
	for _, c := range n.Plans {
		out = append(out, c.scans(relation)...)
	}
	return out
}

// TestPartitionReadUsesIndex shows that a partitioned read, deep in a
// backlog, reads each partition's rows after its position through the
// index of the consumer's partition count: an index range scan that
// looks at no row of another partition nor before the position.
func TestPartitionReadUsesIndex(t *testing.T) {
	t.Parallel()
	db, err := Open(context.Background(), testenv.PostgresURL(t), OpenConfig{MaxOpenConns: 3})
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const topic, group, n = "explain.parts", "explain", 4
	s, err := newSubscriber(db, group, 1, TransportConfig{})
	require.NoError(t, err)
	s.partitions = n
	t.Cleanup(func() { _ = s.Close() })
	require.NoError(t, s.SubscribeInitialize(topic))
	messages := MessagesTable("", topic)
	for i := range 4 { // a backlog written by several transactions, half of it by hand
		bucket := "(g % 1024)::smallint"
		if i%2 == 1 {
			bucket = "NULL"
		}
		_, err := db.ExecContext(ctx, `INSERT INTO `+messages+` (uuid, payload, metadata, transaction_id, bucket)
			SELECT 'u' || g, json_build_object('subject', 's' || g), '{}', pg_current_xact_id(), `+bucket+` FROM generate_series(1, 2000) AS g`)
		require.NoError(t, err)
	}
	_, err = db.ExecContext(ctx, `ANALYZE `+messages)
	require.NoError(t, err)
	var (
		xid    string
		offset int64
	)
	require.NoError(t, db.QueryRowContext(ctx, `SELECT transaction_id::text, "offset" FROM `+messages+
		` ORDER BY transaction_id, "offset" OFFSET 6000 LIMIT 1`).Scan(&xid, &offset))

	q := partitionQueries(s.cfg, topic, n)
	parts := []int32{1, 3}
	args := []any{
		parts,
		[]string{partitionGroup(group, 1, n), partitionGroup(group, 3, n)},
		[]string{xid, xid},
		[]int64{offset, offset},
		[]int32{10, 10},
		[]int64{0, 0},
		[]string{"0", "0"},
		[]bool{false, false},
	}
	explain := func() ([]indexScan, []byte) {
		tx, err := db.BeginTx(ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }() // EXPLAIN ANALYZE runs the handed-out write too
		var plan []byte
		require.NoError(t, tx.QueryRowContext(ctx, `EXPLAIN (ANALYZE, FORMAT JSON) `+q.readParts, args...).Scan(&plan))
		var nodes []struct{ Plan indexScan }
		require.NoError(t, json.Unmarshal(plan, &nodes))
		return nodes[0].Plan.scans(messages[1 : len(messages)-1]), plan
	}
	scans, plan := explain()
	for len(scans) == 1 && scans[0].ActualRows < 10 && ctx.Err() == nil { // a transaction open elsewhere hides the rows for a while
		scans, plan = explain()
	}
	require.Len(t, scans, 1, "%s", plan)
	scan := scans[0]
	require.Equal(t, "Index Scan", scan.Type, "%s", plan)
	require.Equal(t, bucketIndex("", topic, n), scan.Index, "%s", plan)
	require.Equal(t, 2.0, scan.Loops, "a scan per partition: %s", plan)
	require.Equal(t, 10.0, scan.ActualRows, "10 rows per partition: %s", plan)
	require.Zero(t, scan.RemovedByFilter, "rows of other partitions, or before the position, were looked at: %s", plan)
}

func TestPartitionGroups(t *testing.T) {
	t.Parallel()
	require.Equal(t, "c.d#3/8", partitionGroup("c.d", 3, 8))
	for _, bad := range []string{"c.d", "c.d#3", "c.d#8/8", "c.d#-1/8", "c.d#03/8", "c.d#3/08", "c.dx#3/8", "c.d#a/8", "other#1/2"} {
		_, _, ok := partitionOfGroup("c.d", bad)
		require.False(t, ok, bad)
	}
	p, n, ok := partitionOfGroup("c.d", "c.d#3/8")
	require.True(t, ok)
	require.Equal(t, [2]int{3, 8}, [2]int{p, n})
	require.Equal(t, fmt.Sprint(bucketIndex("", "t", 4)), "watermill_t_bucket_mod_4")
}
