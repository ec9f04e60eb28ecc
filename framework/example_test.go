package framework_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/jmoiron/sqlx"

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

// openExampleDB opens a migrated SQLite file in dir, with a ledger table
// for the examples' handlers.
func openExampleDB(ctx context.Context, dir string) (*sqlx.DB, *sqlite.Store, error) {
	db, err := sqlite.Open(ctx, filepath.Join(dir, "app.db"), sqlite.OpenConfig{})
	if err != nil {
		return nil, nil, err
	}
	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE ledger (order_id TEXT, cents INTEGER)`); err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	if err != nil {
		_ = db.Close()
		return nil, nil, err
	}
	return db, store, nil
}

// exampleUnitOfWork is the package Example's set-up, for the other examples: a
// unit of work on a migrated SQLite file in a folder of its own, which done
// removes.
func exampleUnitOfWork(ctx context.Context) (uow *driver.UnitOfWork, done func()) {
	dir, err := os.MkdirTemp("", "framework-example")
	if err != nil {
		panic(err)
	}
	db, store, err := openExampleDB(ctx, dir)
	if err != nil {
		panic(err)
	}
	uow, err = driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	if err != nil {
		panic(err)
	}
	return uow, func() {
		_ = db.Close()
		_ = os.RemoveAll(dir)
	}
}

// A consumer processes an event once, however often it is delivered
// (driver.Consume runs it in a unit of work, without a router): the
// handler's write and the processed mark commit in one SQLite transaction.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "consume-example")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	db, store, err := openExampleDB(ctx, dir)
	if err != nil {
		panic(err)
	}
	defer db.Close()

	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	if err != nil {
		panic(err)
	}
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

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 4200}, framework.Attributes{ID: "evt-1", Source: "payments"})
	if err != nil {
		panic(err)
	}
	body, err := framework.Encode(env)
	if err != nil {
		panic(err)
	}
	for range 2 { // the broker delivers it twice
		outcome, err := driver.Consume(ctx, consumer, uow, body)
		fmt.Println(outcome, err)
	}
	var rows int
	if err := db.GetContext(ctx, &rows, `SELECT count(*) FROM ledger`); err != nil {
		panic(err)
	}
	fmt.Println("ledger rows:", rows)

	_, err = driver.Consume(ctx, consumer, uow, []byte(`{"specversion":"1.0"}`))
	fmt.Println(framework.CodeOf(err), framework.IsPermanent(err))
	// Output:
	// processed <nil>
	// duplicate <nil>
	// ledger rows: 1
	// malformed_envelope true
}
