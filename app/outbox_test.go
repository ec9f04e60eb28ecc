package app_test

import (
	"context"
	"testing"

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
		_, err := framework.Conn(ctx, db).ExecContext(ctx, `INSERT INTO widgets (name, event_id) VALUES (?, ?)`, ev.Data.Name, ev.ID)
		return err
	}
}

func TestOutboxFollowUpEvent(t *testing.T) {
	t.Parallel()
	b := setup(t, testConfig(t),
		handlers.Consumer("widgets.count-widget", handlers.On(widgetAdded, newCountWidget)),
		handlers.Consumer("widgets.store-counted", handlers.On(widgetCounted, newStoreCounted)),
	)
	b.publish(t, "w-1", "sprocket")
	b.publish(t, "w-1", "sprocket") // a duplicate: no second follow-up
	waitFor(t, "the follow-up event's effect", func() bool {
		return b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'counted/w-1'`) == 1
	})
	waitFor(t, "the outbox row marked sent", func() bool {
		return b.count(t, `SELECT count(*) FROM outbox WHERE sent_at IS NOT NULL`) == 1
	})
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM outbox`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM processed_events WHERE consumer = 'widgets.store-counted'`))
	require.Equal(t, 1, b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'counted/w-1'`), "the follow-up took effect once")
}
