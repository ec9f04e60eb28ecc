package postgres_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// TestAdoptGroupPartitions: the renamed consumer's groups in each offsets
// table are the old name's and its partitions' groups, every column
// copied, under the new name; another consumer's groups, one whose name
// only begins with the old name's included, stay out; a table where the
// new name has a group already, and one of a topic it does not read, are
// left as they are.
func TestAdoptGroupPartitions(t *testing.T) {
	t.Parallel()
	url := testenv.PostgresURL(t)
	db := open(t, url, 2)
	tr := newTransport(t, db, url)
	for _, topic := range []string{"a", "b", "c"} {
		db.MustExec(`CREATE TABLE "watermill_offsets_adopt.` + topic + `" (
			consumer_group VARCHAR(255) NOT NULL PRIMARY KEY,
			offset_acked BIGINT,
			last_processed_transaction_id xid8 NOT NULL,
			note text)`)
		db.MustExec(`INSERT INTO "watermill_offsets_adopt.` + topic + `" VALUES
			('old', 5, '100', 'plain'), ('old#0/4', 7, '101', 'p0'), ('old#3/4', NULL, '102', 'p3'),
			('oldx', 1, '1', 'another'), ('other#0/4', 2, '2', 'another')`)
	}
	db.MustExec(`INSERT INTO "watermill_offsets_adopt.b" VALUES ('new#1/4', 3, '50', 'its own')`)

	got, err := tr.AdoptGroup(t.Context(), "new", "old", []string{"adopt.a", "adopt.b"})
	require.NoError(t, err)
	require.ElementsMatch(t, []driver.GroupPosition{
		{Table: "watermill_offsets_adopt.a", Group: "new", Offset: 5},
		{Table: "watermill_offsets_adopt.a", Group: "new#0/4", Offset: 7},
		{Table: "watermill_offsets_adopt.a", Group: "new#3/4", Offset: 0},
	}, got)

	type row struct {
		Group  string  `db:"consumer_group"`
		Offset *int64  `db:"offset_acked"`
		XID    string  `db:"xid"`
		Note   *string `db:"note"`
	}
	rows := func(topic string) []row {
		var rs []row
		require.NoError(t, db.Select(&rs, `SELECT consumer_group, offset_acked, last_processed_transaction_id::text AS xid, note
			FROM "watermill_offsets_adopt.`+topic+`" WHERE consumer_group LIKE 'new%' ORDER BY consumer_group`))
		return rs
	}
	p := func(v int64) *int64 { return &v }
	s := func(v string) *string { return &v }
	require.Equal(t, []row{
		{"new", p(5), "100", s("plain")},
		{"new#0/4", p(7), "101", s("p0")},
		{"new#3/4", nil, "102", s("p3")},
	}, rows("a"))
	require.Equal(t, []row{{"new#1/4", p(3), "50", s("its own")}}, rows("b"), "the new name has a group there already")
	require.Empty(t, rows("c"), "a topic the new name does not read")

	again, err := tr.AdoptGroup(t.Context(), "new", "old", []string{"adopt.a", "adopt.b"})
	require.NoError(t, err)
	require.Empty(t, again)
}
