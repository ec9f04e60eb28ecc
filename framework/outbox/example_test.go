package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
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
// mail provider sends it. An attempt that fails rolls its intent back with
// the rest of its writes, so nothing is published for it.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.OpenConfig{})
	if err != nil {
		panic(err)
	}
	defer db.Close()
	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
		panic(err)
	}
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	if err != nil {
		panic(err)
	}
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	if err != nil {
		panic(err)
	}
	box, err := outbox.New(db, outbox.Config{})
	if err != nil {
		panic(err)
	}

	// Two attempts of a consumer handling the booking "b-1": the first
	// fails after its Add, the second succeeds.
	booking := framework.Key{Source: "appointments", ID: "b-1"}
	for _, fail := range []bool{true, false} {
		outcome, err := uow.Do(ctx, "notifications.mail-on-booked", booking, func(ctx context.Context) error {
			env, err := emailRequested.Envelope(emailRequestedV1{To: "ada@example.com", Template: "booked"},
				framework.Attributes{ID: framework.FollowUpID(booking, "mail"), Source: "notifications"})
			if err != nil {
				return err
			}
			if err := box.Add(ctx, env); err != nil { // in the attempt's transaction
				return err
			}
			if fail {
				return errors.New("calendar unavailable")
			}
			return nil
		})
		fmt.Println(outcome, err)
	}

	relay, err := outbox.NewRelay(db, printer{}, outbox.RelayConfig{Outbox: box})
	if err != nil {
		panic(err)
	}
	n, err := relay.PublishUnsent(ctx) // what Run does at each poll
	fmt.Println(n, err)
	// Output:
	// failed calendar unavailable
	// processed <nil>
	// published b52ba95e-4e20-580c-8110-1e78f2f9a153 to notifications.email.requested
	// 1 <nil>
}
