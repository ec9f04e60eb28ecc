package outbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"
	"go.opentelemetry.io/otel/trace"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/internal/sqlstore"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/internal/pipeline"
)

// markFunc marks the rows of ids sent, in one statement.
type markFunc func(ctx context.Context, ids []int64) error

// publish publishes rows in id order, and marks sent those the transport
// took, with mark. It publishes no row after the first it cannot publish,
// nor once ctx ends. It returns once the rows are published; the function
// it returns waits for their marks (under bctx) and returns the ids it
// marked, and how many of them it dropped (see unroutable).
func (r *Relay) publish(ctx, bctx context.Context, rows []sqlstore.OutboxRow, mark markFunc) func() (sent []int64, dropped int, err error) {
	mark = diesBeforeMark(ctx, mark)
	if r.deferred != nil {
		return r.publishPipelined(ctx, bctx, rows, mark)
	}
	sent, pubErr := r.publishEach(ctx, rows)
	return func() ([]int64, int, error) {
		if err := mark(bctx, sent); err != nil {
			return nil, 0, errors.Join(pubErr, err)
		}
		return sent, 0, pubErr
	}
}

// diesBeforeMark returns mark, preceded by the crash point
// crash.BeforeOutboxSent when ctx carries a crash hook (tests only): a
// hook that kills the process there leaves published rows unmarked, and
// one that returns true fails the marking, so that the rows stay unsent.
func diesBeforeMark(ctx context.Context, mark markFunc) markFunc {
	h := crash.HookOf(ctx)
	if h == nil {
		return mark
	}
	return func(mctx context.Context, ids []int64) error {
		if len(ids) > 0 && h(ctx, crash.BeforeOutboxSent) {
			return &crash.Died{At: crash.BeforeOutboxSent}
		}
		return mark(mctx, ids)
	}
}

// publishEach publishes rows in order through the publisher, each once the
// one before returned, until one fails or ctx ends, and returns the ids of
// those published.
func (r *Relay) publishEach(ctx context.Context, rows []sqlstore.OutboxRow) ([]int64, error) {
	sent := make([]int64, 0, len(rows))
	tr := newTracer(r.cfg.Tracer, r.cfg.MessagingSystem)
	for _, row := range rows {
		if ctx.Err() != nil {
			break
		}
		msg := rowMessage(row)
		span := tr.startPublish(row, msg)
		err := r.pub.Publish(row.Type, msg)
		endPublish(span, err)
		if err != nil {
			return sent, fmt.Errorf("outbox: publish %s (row %d) to %s: %w", row.Key, row.ID, row.Type, err)
		}
		sent = append(sent, row.ID)
	}
	return sent, nil
}

// pendingRow is a row published and waiting for the broker's confirm.
type pendingRow struct {
	row  sqlstore.OutboxRow
	wait func(context.Context) error
	span trace.Span // ends with the confirm
}

// publishPipelined publishes rows in order through the DeferredPublisher
// without waiting for their confirms, while a goroutine waits for the
// confirms in order. The function it returns waits for the last confirm
// and marks the confirmed rows sent in one statement. A row nacked, or
// left unconfirmed when the connection goes away, stays unsent; the rows
// confirmed around it are marked. So does a row routed nowhere, unless
// its type may be dropped (see unroutable).
func (r *Relay) publishPipelined(ctx, bctx context.Context, rows []sqlstore.OutboxRow, mark markFunc) func() ([]int64, int, error) {
	pending := make(chan pendingRow, len(rows))
	confirmed := make(chan confirms, 1)
	go func() { confirmed <- r.awaitConfirms(bctx, pending, len(rows)) }()
	var (
		pubErr  error
		refused map[string]bool // types whose topic the broker refused in this batch
	)
	tr := newTracer(r.cfg.Tracer, r.cfg.MessagingSystem)
	for _, row := range rows {
		if ctx.Err() != nil {
			break
		}
		if refused[row.Type] {
			continue // stays unsent, as the first row of its type
		}
		msg := rowMessage(row)
		span := tr.startPublish(row, msg)
		wait, err := r.deferred.PublishDeferred(bctx, row.Type, msg)
		if errors.Is(err, driver.ErrTopicRefused) {
			// The type's rows wait, left out of the claims but for a
			// probe (see unroutable); the other rows go on.
			endPublish(span, err)
			r.unroutable.refused(ctx, row.Type, err)
			if refused == nil {
				refused = map[string]bool{}
			}
			refused[row.Type] = true
			continue
		}
		if err != nil {
			endPublish(span, err)
			pubErr = fmt.Errorf("outbox: publish %s (row %d) to %s: %w", row.Key, row.ID, row.Type, err)
			break
		}
		pending <- pendingRow{row: row, wait: wait, span: span}
	}
	close(pending)
	return func() ([]int64, int, error) {
		c := <-confirmed
		if err := mark(bctx, c.ids); err != nil {
			return nil, 0, errors.Join(pubErr, c.err, err)
		}
		return c.ids, c.dropped, errors.Join(pubErr, c.err)
	}
}

// confirms is what awaitConfirms returns: the ids to mark sent (those
// confirmed, and those dropped), how many were dropped, and the first
// failure.
type confirms struct {
	ids     []int64
	dropped int
	err     error
}

// awaitConfirms waits for the confirm of each pending row in order, and
// returns the ids of those confirmed and the first failure (with how many
// rows failed). A row the broker routed nowhere is no failure: it is left
// unsent, or dropped (see unroutable).
func (r *Relay) awaitConfirms(ctx context.Context, pending <-chan pendingRow, n int) confirms {
	var (
		c      = confirms{ids: make([]int64, 0, n)}
		failed int
	)
	for p := range pending {
		err := p.wait(ctx)
		endPublish(p.span, err)
		switch {
		case errors.Is(err, driver.ErrUnroutable):
			if r.unroutable.returned(p.row.Type) {
				c.ids = append(c.ids, p.row.ID)
				c.dropped++
			}
		case err != nil:
			if c.err == nil {
				c.err = fmt.Errorf("outbox: publish %s (row %d) to %s: %w", p.row.Key, p.row.ID, p.row.Type, err)
			}
			failed++
		default:
			r.unroutable.routed(p.row.Type)
			c.ids = append(c.ids, p.row.ID)
		}
	}
	if failed > 1 {
		c.err = fmt.Errorf("%w (and %d more rows unconfirmed)", c.err, failed-1)
	}
	return c
}

// rowMessage is the message of row: the stored CloudEvent, the event id as
// UUID, and the content type, as framework.NewMessage builds it.
func rowMessage(row sqlstore.OutboxRow) *message.Message {
	msg := message.NewMessage(row.Key.ID, row.Body)
	msg.Metadata.Set(framework.MetadataContentType, framework.ContentType)
	// The row's subject and id are the body's (AddTx wrote them from the
	// event it encoded), as its type is the topic's.
	msg.SetContext(pipeline.With(msg.Context(), pipeline.PartitionKey(driver.PartitionKey(row.Subject, row.Key.ID))))
	return msg
}
