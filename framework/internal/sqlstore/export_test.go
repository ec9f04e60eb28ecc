package sqlstore

import "time"

// PurgesBySentAt returns, by table, the statements that delete rows sent
// before a time (the outbox's cleanup, the purge of sent replays) in d's
// dialect, unprefixed, with their arguments for before and limit.
func PurgesBySentAt(d Dialect, before time.Time, limit int) (statements map[string]string, args []any) {
	q := newQueries(d, "")
	return map[string]string{"outbox": q.sql(qOutboxCleanup), "replays": q.sql(qPurgeReplays)},
		[]any{d.timeArg(before), limit}
}

// TimeArg is d.timeArg: t as d stores it.
func TimeArg(d Dialect, t time.Time) any { return d.timeArg(t) }

// ClaimStatement is the claim of relays on PostgreSQL (qOutboxClaim),
// unprefixed, with its arguments for limit and maxBytes.
func ClaimStatement(limit, maxBytes int) (statement string, args []any) {
	return newQueries(Postgres, "").sql(qOutboxClaim), []any{maxBytes, limit}
}

// WithIDList is d.withIDList: query with its {in_ids} in d's form.
func WithIDList(d Dialect, query string) string { return d.withIDList(query) }

// IDList is d.idList: ids as the argument of {in_ids}.
func IDList(d Dialect, ids []int64) any { return d.idList(ids) }
