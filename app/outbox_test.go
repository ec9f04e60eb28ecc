package app_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
)

type widgetCountedV1 struct {
	Name string `json:"name" validate:"required"`
}

var widgetCounted = framework.Define[widgetCountedV1]("widgets.widget.counted", 1)

// newCountWidget records a follow-up event in the attempt's transaction.
// Its id derives from the handled event's, so a retry adds the same event.
func newCountWidget(box *outbox.Outbox) framework.HandlerFunc[widgetAddedV1] {
	return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
		env, err := widgetCounted.Envelope(widgetCountedV1(ev.Data), framework.Attributes{
			ID:            "counted/" + ev.ID,
			Source:        "widgets.counter",
			CorrelationID: ev.ID,
		})
		if err != nil {
			return err
		}
		return box.Add(ctx, env)
	}
}

// newStoreCounted is the follow-up's consumer: one row per event.
func newStoreCounted(db *sqlx.DB) framework.HandlerFunc[widgetCountedV1] {
	return func(ctx context.Context, ev framework.Event[widgetCountedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO widgets (name, event_id) VALUES (?, ?)`), ev.Data.Name, ev.ID)
		return err
	}
}

// TestOutboxFollowUpEvent runs a consumer that adds a follow-up event to
// the outbox, which another consumer of the same service handles once, on
// each transport with a database of its own kind.
func TestOutboxFollowUpEvent(t *testing.T) {
	t.Parallel()
	for _, tc := range transportConfigs {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := tc.config(t)
			// Fresh names: queues on the shared broker outlive the test.
			suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
			b := setup(t, cfg,
				handlers.Register("widgets.count-widget-"+suffix, handlers.On(widgetAdded, newCountWidget)),
				handlers.Register("widgets.store-counted-"+suffix, handlers.On(widgetCounted, newStoreCounted)),
			)
			id := "w-" + suffix
			b.publish(t, id, "sprocket")
			b.publish(t, id, "sprocket") // a duplicate: no second follow-up
			q := func(query string) string { return b.db.Rebind(query) }
			waitFor(t, "the follow-up event's effect", func() bool {
				return b.count(t, q(`SELECT count(*) FROM widgets WHERE event_id = ?`), "counted/"+id) == 1
			})
			// Only this event's rows: on RabbitMQ the tests share the widget
			// type's exchange, and the widgets of the tests running beside
			// this one are counted too.
			waitFor(t, "the outbox row marked sent", func() bool {
				return b.count(t, q(`SELECT count(*) FROM outbox WHERE event_id = ? AND sent_at IS NOT NULL`), "counted/"+id) == 1
			})
			require.Equal(t, 1, b.count(t, q(`SELECT count(*) FROM outbox WHERE event_id = ?`), "counted/"+id))
			require.Equal(t, 1, b.count(t, q(`SELECT count(*) FROM processed_events WHERE consumer = ? AND event_id = ?`), "widgets.store-counted-"+suffix, "counted/"+id))
			require.Equal(t, 1, b.count(t, q(`SELECT count(*) FROM widgets WHERE event_id = ?`), "counted/"+id), "the follow-up took effect once")
		})
	}
}
