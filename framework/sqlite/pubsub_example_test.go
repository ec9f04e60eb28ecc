package sqlite_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/sqlite"
)

// A Publisher and a Subscriber on one SQLite file, sharing a Notifier so
// that the subscription wakes as soon as the message is committed.
func Example_pubSub() {
	dir, err := os.MkdirTemp("", "pubsub-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)

	ctx := context.Background()
	db, err := sqlite.Open(ctx, filepath.Join(dir, "data", "effectively.db"), sqlite.OpenConfig{})
	if err != nil {
		panic(err)
	}
	defer db.Close()

	notifier := sqlite.NewNotifier()
	pub, err := sqlite.NewPublisher(db, sqlite.PublisherConfig{Notifier: notifier})
	if err != nil {
		panic(err)
	}
	defer pub.Close()
	sub, err := sqlite.NewSubscriber(db, sqlite.SubscriberConfig{
		ConsumerGroup: "notifications.remind-on-appointment-booked",
		Notifier:      notifier,
	})
	if err != nil {
		panic(err)
	}
	defer sub.Close()

	const topic = "appointments.appointment.booked"
	msgs, err := sub.Subscribe(ctx, topic)
	if err != nil {
		panic(err)
	}
	event := message.NewMessage("evt-1", []byte(`{"specversion":"1.0","id":"evt-1","source":"appointments",`+
		`"type":"appointments.appointment.booked","eventversion":1,"data":{"appointment_id":"appt-7"}}`))
	if err := pub.Publish(topic, event); err != nil {
		panic(err)
	}

	msg := <-msgs
	fmt.Println(msg.UUID, "redelivered:", msg.Metadata.Get(framework.MetadataRedelivered))
	msg.Ack()
	// Output: evt-1 redelivered: false
}
