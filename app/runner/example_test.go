package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/app/runner"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
)

type PaymentCaptured struct {
	OrderID string `json:"orderId" validate:"required"`
	Cents   int64  `json:"cents" validate:"gt=0"`
}

var Captured = framework.Define[PaymentCaptured]("payments.payment.captured", 1)

// A consumer run on SQLite with no dependency injection: the event is
// published twice, and takes effect once.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "runner-example")
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (order_id TEXT, cents INTEGER)`); err != nil {
		panic(err)
	}
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	if err != nil {
		panic(err)
	}
	transport, err := sqlite.New(db, sqlite.TransportConfig{})
	if err != nil {
		panic(err)
	}
	defer transport.Close()

	consumer, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			_, err := framework.Conn(ctx, db).ExecContext(ctx, // in the attempt's transaction
				`INSERT INTO ledger (order_id, cents) VALUES (?, ?)`, ev.Data.OrderID, ev.Data.Cents)
			return err
		}),
	)
	if err != nil {
		panic(err)
	}
	r, err := runner.New(runner.Config{
		Consumers: []runner.ConsumerConfig{{Consumer: consumer}},
		Transport: transport,
		DB:        db,
		Store:     store,
	})
	if err != nil {
		panic(err)
	}
	// Around the whole chain: count the deliveries handled (acknowledged).
	var handled atomic.Int32
	r.AddMiddleware(func(h message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			msgs, err := h(msg)
			if err == nil {
				handled.Add(1)
			}
			return msgs, err
		}
	})
	if err := r.Start(ctx); err != nil {
		panic(err)
	}

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 4200}, framework.Attributes{ID: "evt-1", Source: "payments"})
	if err != nil {
		panic(err)
	}
	for range 2 { // published twice, by a producer that retried
		msg, err := framework.NewMessage(env)
		if err != nil {
			panic(err)
		}
		if err := transport.Publisher().Publish(Captured.Type(), msg); err != nil {
			panic(err)
		}
	}
	for i := 0; handled.Load() < 2; i++ { // both copies handled
		if i == 1000 {
			panic("not handled in time")
		}
		time.Sleep(10 * time.Millisecond)
	}

	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := r.Stop(stopCtx); err != nil {
		panic(err)
	}
	var rows []struct {
		OrderID string `db:"order_id"`
		Cents   int64  `db:"cents"`
	}
	if err := db.SelectContext(ctx, &rows, `SELECT order_id, cents FROM ledger`); err != nil {
		panic(err)
	}
	fmt.Println("handled:", handled.Load(), "ledger:", rows)
	// Output: handled: 2 ledger: [{o-1 4200}]
}

// A service on a runner alone replays its dead letters: the handler
// refuses a payment, which becomes a dead letter; once the handler is
// fixed, an operator replays it (what effectively dead-letters replay
// records in the database), and the runner's replay relay delivers it
// again, to this consumer alone.
func Example_replay() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "runner-example")
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
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (order_id TEXT, cents INTEGER)`); err != nil {
		panic(err)
	}
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	if err != nil {
		panic(err)
	}
	transport, err := sqlite.New(db, sqlite.TransportConfig{})
	if err != nil {
		panic(err)
	}
	defer transport.Close()

	var fixed atomic.Bool
	consumer, err := framework.NewConsumer("billing.ledger",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			if !fixed.Load() {
				return framework.Permanent("ledger_closed", errors.New("the ledger is closed"))
			}
			_, err := framework.Conn(ctx, db).ExecContext(ctx,
				`INSERT INTO ledger (order_id, cents) VALUES (?, ?)`, ev.Data.OrderID, ev.Data.Cents)
			return err
		}),
	)
	if err != nil {
		panic(err)
	}
	// The runner runs the consumer, the replay relay and the purge (and,
	// given an outbox in OutboxRelay, the outbox relay).
	r, err := runner.New(runner.Config{
		Consumers: []runner.ConsumerConfig{{Consumer: consumer}},
		Transport: transport,
		DB:        db,
		Store:     store,
	})
	if err != nil {
		panic(err)
	}
	if err := r.Start(ctx); err != nil {
		panic(err)
	}
	stopCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	defer func() {
		if err := r.Stop(stopCtx); err != nil {
			panic(err)
		}
	}()

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 4200}, framework.Attributes{ID: "evt-1", Source: "payments"})
	if err != nil {
		panic(err)
	}
	msg, err := framework.NewMessage(env)
	if err != nil {
		panic(err)
	}
	if err := transport.Publisher().Publish(Captured.Type(), msg); err != nil {
		panic(err)
	}
	var dls []driver.DeadLetter
	waitFor(func() bool {
		dls, err = store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer.Name()})
		return err == nil && len(dls) == 1
	})
	fmt.Println("dead letter:", dls[0].EventID, dls[0].Code)

	fixed.Store(true) // the fix is deployed
	if _, err := store.ResolveDeadLetter(ctx, dls[0].ID, driver.Resolution{
		Status: driver.DeadLetterReplayed, By: "ops", Reason: "ledger reopened",
	}); err != nil {
		panic(err)
	}
	var cents int64
	waitFor(func() bool {
		return db.GetContext(ctx, &cents, `SELECT cents FROM ledger WHERE order_id = 'o-1'`) == nil
	})
	fmt.Println("replayed: ledger o-1", cents)
	// Output:
	// dead letter: evt-1 ledger_closed
	// replayed: ledger o-1 4200
}

// waitFor polls cond for up to 30 seconds.
func waitFor(cond func() bool) {
	for i := 0; !cond(); i++ {
		if i == 3000 {
			panic("not in time")
		}
		time.Sleep(10 * time.Millisecond)
	}
}
