package latest_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/latest"
)

// A projection keeps each appointment's newest status although its events
// arrive out of order: 7, 9, 8, then another event carrying 9 again. Each
// is processed once; only the newer states are written.
func Example() {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "latest-example")
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
	// The service's own migration.
	if _, err := db.ExecContext(ctx, `CREATE TABLE appointment_view (
		appointment_id TEXT PRIMARY KEY, seq INTEGER NOT NULL, status TEXT NOT NULL)`); err != nil {
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

	// snippet:begin projection
	view, err := latest.New(latest.Config{
		Table:   "appointment_view",
		Key:     []string{"appointment_id"},
		Version: "seq",
		Columns: []string{"status"},
	})
	if err != nil {
		panic(err)
	}
	consumer, err := framework.NewConsumer("views.appointments",
		framework.Handle(Changed, func(ctx context.Context, ev framework.Event[ChangedV1]) error {
			applied, err := view.Upsert(ctx, framework.Conn(ctx, db), latest.Row{
				Key:    []any{ev.Data.AppointmentID},
				Stamp:  latest.StampOf(ev.Attributes),
				Values: []any{ev.Data.Status},
			})
			fmt.Printf("%s seq %d applied: %t\n", ev.ID, ev.SubjectSeq, applied)
			return err
		}),
	)
	// snippet:end projection
	if err != nil {
		panic(err)
	}

	for _, ev := range []struct {
		id     string
		seq    int64
		status string
	}{
		{"e-7", 7, "booked"},
		{"e-9", 9, "cancelled"},
		{"e-8", 8, "rescheduled"},
		{"e-9b", 9, "cancelled"},
	} {
		env, err := Changed.Envelope(ChangedV1{AppointmentID: "a-1", Status: ev.status},
			framework.Attributes{ID: ev.id, Source: "appointments", Subject: "a-1", SubjectSeq: ev.seq})
		if err != nil {
			panic(err)
		}
		body, err := framework.Encode(env)
		if err != nil {
			panic(err)
		}
		if _, err := driver.Consume(ctx, consumer, uow, body); err != nil {
			panic(err)
		}
	}
	var row struct {
		Seq    int64  `db:"seq"`
		Status string `db:"status"`
	}
	if err := db.GetContext(ctx, &row, `SELECT seq, status FROM appointment_view WHERE appointment_id = 'a-1'`); err != nil {
		panic(err)
	}
	fmt.Println("a-1:", row.Status, "at", row.Seq)
	// Output:
	// e-7 seq 7 applied: true
	// e-9 seq 9 applied: true
	// e-8 seq 8 applied: false
	// e-9b seq 9 applied: false
	// a-1: cancelled at 9
}
