package outbox_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/framework/sqlite"
)

type emailRequestedV1 struct {
	To       string `json:"to" validate:"required,email"`
	Template string `json:"template" validate:"required"`
}

var emailRequested = framework.Define[emailRequestedV1]("notifications.email.requested", 1)

// printer is a publisher that prints what it is given.
type printer struct{}

func (printer) Publish(topic string, msgs ...*message.Message) error {
	for _, msg := range msgs {
		fmt.Printf("published %s to %s\n", msg.UUID, topic)
	}
	return nil
}

func (printer) Close() error { return nil }

// A handler records the intent to send an e-mail in its transaction; the
// relay publishes it after the commit, and a consumer that talks to the
// mail provider sends it.
func Example() {
	ctx := context.Background()
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, _ := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.OpenConfig{})
	defer db.Close()
	_ = migrate.Up(ctx, db, migrate.Config{})
	store, _ := sqlite.NewStore(db, sqlite.StoreConfig{})
	uow, _ := framework.NewUnitOfWork(framework.UnitOfWorkConfig{DB: db, Processed: store})
	box, _ := outbox.New(db, outbox.Config{})

	// The attempt of a consumer handling the booking "b-1".
	booking := framework.Key{Source: "appointments", ID: "b-1"}
	_, err := uow.Do(ctx, "notifications.mail-on-booked", booking, func(ctx context.Context) error {
		env, err := emailRequested.Envelope(emailRequestedV1{To: "ada@example.com", Template: "booked"},
			framework.Attributes{ID: "mail/" + booking.ID, Source: "notifications"})
		if err != nil {
			return err
		}
		return box.Add(ctx, env) // in the attempt's transaction
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	relay, _ := outbox.NewRelay(db, printer{}, outbox.RelayConfig{Outbox: box})
	n, err := relay.PublishUnsent(ctx) // what Run does at each poll
	fmt.Println(n, err)
	// Output:
	// published mail/b-1 to notifications.email.requested
	// 1 <nil>
}
