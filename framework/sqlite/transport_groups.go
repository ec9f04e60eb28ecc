package sqlite

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.GroupAdopter = (*Transport)(nil)

// The SQL of AdoptGroup: ?1 the new group, ?2 the old one, ?3 the topics
// (a JSON array). The leases
// (messages claimed and not acknowledged) are copied first, while the
// new group has no row in the groups table of their topic yet.
const (
	qAdoptLeases = `INSERT INTO {leases} (topic, consumer_group, "offset", deliveries, locked_until)
SELECT l.topic, ?1, l."offset", l.deliveries, l.locked_until FROM {leases} AS l
WHERE l.consumer_group = ?2 AND l.topic IN (SELECT value FROM json_each(?3))
    AND NOT EXISTS (SELECT 1 FROM {groups} AS g WHERE g.topic = l.topic AND g.consumer_group = ?1)
ON CONFLICT DO NOTHING`
	qAdoptGroups = `INSERT INTO {groups} (topic, consumer_group, claimed_offset, created_at)
SELECT topic, ?1, claimed_offset, created_at FROM {groups}
WHERE consumer_group = ?2 AND topic IN (SELECT value FROM json_each(?3))
ON CONFLICT DO NOTHING
RETURNING topic, claimed_offset`
)

// AdoptGroup gives consumer's group, in each of topics where it has no
// row yet, from's claimed offset and from's leases (the messages it claimed
// and did not acknowledge, each due when from's was, with its delivery
// count), in one transaction, and returns the positions adopted, each
// with Table the topic and Offset the claimed offset. From's rows stay,
// and keep the messages after them from the cleanup until removed.
func (t *Transport) AdoptGroup(ctx context.Context, consumer, from string, topics []string) ([]driver.GroupPosition, error) {
	if consumer == "" || from == "" || consumer == from {
		return nil, fmt.Errorf("sqlite: adopt group %q for %q: want two different consumer names", from, consumer)
	}
	if err := InitializePubSubSchema(ctx, t.db, t.cfg.TablePrefix); err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: %w", from, consumer, err)
	}
	r := strings.NewReplacer(
		"{groups}", t.cfg.TablePrefix+PubSubGroupsTable,
		"{leases}", t.cfg.TablePrefix+PubSubLeasesTable,
	)
	list, err := json.Marshal(topics)
	if err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: %w", from, consumer, err)
	}
	tx, err := t.db.BeginTxx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: begin: %w", from, consumer, err)
	}
	defer func() { _ = tx.Rollback() }() // no-op after Commit
	if _, err := tx.ExecContext(ctx, r.Replace(qAdoptLeases), consumer, from, string(list)); err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: the leases: %w", from, consumer, err)
	}
	var rows []struct {
		Topic  string `db:"topic"`
		Offset int64  `db:"claimed_offset"`
	}
	if err := tx.SelectContext(ctx, &rows, r.Replace(qAdoptGroups), consumer, from, string(list)); err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: %w", from, consumer, err)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("sqlite: adopt group %s for %s: commit: %w", from, consumer, err)
	}
	out := make([]driver.GroupPosition, len(rows))
	for i, row := range rows {
		out[i] = driver.GroupPosition{Table: row.Topic, Group: consumer, Offset: row.Offset}
	}
	return out, nil
}
