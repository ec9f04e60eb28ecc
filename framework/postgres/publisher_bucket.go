package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	wsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
)

// bucketRetry is how long the publisher inserts without the bucket
// column after it could not add it to a table, before it tries again.
const bucketRetry = time.Minute

// bucketTopics knows, for each topic the publisher published to, whether
// its messages table has the bucket column: the publisher adds it once
// per topic, and writes each row's bucket when the table has it.
type bucketTopics struct {
	db  *sqlx.DB
	cfg TransportConfig

	mu     sync.Mutex
	topics map[string]bucketState
}

// bucketState is what the publisher knows of a topic's bucket column.
type bucketState struct {
	has     bool
	retryAt time.Time // without it: when to try to add it again
	warned  bool
}

// prepare adds the bucket column to topic's table (creating the table)
// the first time topic is published to, and again after bucketRetry while
// it could not. A failure is logged once per topic: the rows go without
// their bucket, computed from their payload when a partitioned consumer
// reads them.
func (b *bucketTopics) prepare(ctx context.Context, topic string) {
	now := time.Now()
	b.mu.Lock()
	st, known := b.topics[topic]
	b.mu.Unlock()
	if known && (st.has || now.Before(st.retryAt)) {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	defer cancel()
	err := initializeTables(ctx, b.db, b.cfg, topic, false)
	if err == nil {
		err = ensureBucket(ctx, b.db, b.cfg, topic, false)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	st = b.topics[topic]
	if err == nil {
		st.has = true
	} else {
		st.retryAt = now.Add(bucketRetry)
		if !st.warned {
			st.warned = true
			b.cfg.Logger.Warn("postgres publisher: could not add the bucket column; rows go without it (a partitioned consumer computes it from the payload)",
				slog.String("topic", topic), slog.Any("error", err), slog.Duration("retry_in", bucketRetry))
		}
	}
	b.topics[topic] = st
}

// has reports whether topic's table has the bucket column.
func (b *bucketTopics) has(topic string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.topics[topic].has
}

// publisherSchema is the publisher's schema: it writes each row's bucket
// when the table has the column.
type publisherSchema struct {
	schema
	buckets *bucketTopics
}

var _ wsql.SchemaAdapter = publisherSchema{}

// InsertQuery inserts msgs as the default schema does, with each row's
// bucket (payloadBucket) when topic's table has the column.
func (s publisherSchema) InsertQuery(params wsql.InsertQueryParams) (wsql.Query, error) {
	if !s.buckets.has(params.Topic) {
		return s.schema.InsertQuery(params)
	}
	var (
		values strings.Builder
		args   = make([]any, 0, 4*len(params.Msgs))
	)
	for i, msg := range params.Msgs {
		metadata, err := json.Marshal(msg.Metadata)
		if err != nil {
			return wsql.Query{}, fmt.Errorf("marshal the metadata of message %s: %w", msg.UUID, err)
		}
		if i > 0 {
			values.WriteByte(',')
		}
		n := 4 * i
		fmt.Fprintf(&values, "($%d,$%d,$%d,pg_current_xact_id(),$%d)", n+1, n+2, n+3, n+4)
		args = append(args, msg.UUID, []byte(msg.Payload), metadata, int16(payloadBucket(msg.Payload)))
	}
	return wsql.Query{
		Query: `INSERT INTO ` + s.MessagesTable(params.Topic) +
			` (uuid, payload, metadata, transaction_id, ` + bucketColumn + `) VALUES ` + values.String(),
		Args: args,
	}, nil
}

// contextOf returns the context of the first of msgs, as watermill-sql's
// publisher uses for its insert.
func contextOf(msgs []*message.Message) context.Context {
	if len(msgs) == 0 {
		return context.Background()
	}
	return msgs[0].Context()
}
