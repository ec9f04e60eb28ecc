package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/pipeline"
)

var _ driver.BacklogCounter = (*Transport)(nil)

// Backlogs returns what waits for consumer (driver.BacklogCounter): the
// SQLite transport does not partition, so one partition, 0, whatever
// partitions says. In each topic of types and in the consumer's replay
// topic: the messages after the group's claimed offset (at most
// driver.BacklogCap of them), and those claimed and not yet acknowledged
// (its leases: in flight, or nacked and due again). The age of the
// oldest of them is the file's clock less its created_at. A topic the
// group has no row of yet (the consumer never subscribed) has nothing
// waiting.
//
// Each topic costs one query on the messages' (topic, offset) index and
// the group's leases.
func (t *Transport) Backlogs(ctx context.Context, consumer string, types []string, _ int) ([]driver.PartitionBacklog, error) {
	if consumer == "" {
		return nil, errors.New("sqlite: backlogs: empty consumer name")
	}
	topics := slices.Clone(types)
	slices.Sort(topics)
	topics = append(slices.Compact(topics), pipeline.ReplayTopic(consumer))
	q := strings.NewReplacer(
		"{messages}", t.cfg.TablePrefix+PubSubMessagesTable,
		"{groups}", t.cfg.TablePrefix+PubSubGroupsTable,
		"{leases}", t.cfg.TablePrefix+PubSubLeasesTable,
	).Replace(backlogQuery)
	out := driver.PartitionBacklog{OldestKnown: true}
	for _, topic := range topics {
		tb := driver.TopicBacklog{Topic: topic}
		var (
			fresh, leased int64
			oldestFresh   sql.NullInt64
			oldestLeased  sql.NullInt64
			now           int64
		)
		err := t.db.QueryRowContext(ctx, q, topic, consumer, driver.BacklogCap+1).
			Scan(&tb.Position, &fresh, &leased, &oldestFresh, &oldestLeased, &now)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			out.Topics = append(out.Topics, tb)
			continue
		case err != nil:
			return nil, fmt.Errorf("sqlite: backlogs of %s in %s: %w", consumer, topic, err)
		}
		tb.Known = true
		waiting := fresh + leased
		tb.Waiting, tb.More = min(waiting, driver.BacklogCap), waiting > driver.BacklogCap
		for _, o := range []sql.NullInt64{oldestFresh, oldestLeased} {
			if o.Valid {
				tb.Oldest = max(tb.Oldest, time.Duration(now-o.Int64)*time.Millisecond)
			}
		}
		out.Topics = append(out.Topics, tb)
		out.Waiting += tb.Waiting
		out.More = out.More || tb.More
		out.Oldest = max(out.Oldest, tb.Oldest)
	}
	if out.Waiting > driver.BacklogCap {
		out.Waiting, out.More = driver.BacklogCap, true
	}
	return []driver.PartitionBacklog{out}, nil
}

// backlogQuery reads, for topic ?1 and group ?2, the group's claimed
// offset, the messages after it (at most ?3), the group's leases, the
// created_at of the first message after it and of the oldest leased, and
// the file's clock; no row when the group has none of the topic.
var backlogQuery = `SELECT g.claimed_offset,
	(SELECT count(*) FROM (SELECT 1 FROM {messages} m WHERE m.topic = ?1 AND m."offset" > g.claimed_offset LIMIT ?3)),
	(SELECT count(*) FROM {leases} l WHERE l.topic = ?1 AND l.consumer_group = ?2),
	(SELECT ` + millisOf("m.created_at") + ` FROM {messages} m WHERE m.topic = ?1 AND m."offset" > g.claimed_offset ORDER BY m."offset" LIMIT 1),
	(SELECT min(` + millisOf("m.created_at") + `) FROM {leases} l JOIN {messages} m ON m."offset" = l."offset"
		WHERE l.topic = ?1 AND l.consumer_group = ?2),
	` + nowMillis + `
	FROM {groups} g WHERE g.topic = ?1 AND g.consumer_group = ?2`
