package testkit_test

import (
	"context"
	"fmt"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/middleware"
)

// The crash examples: docs/testing.md shows the code between their
// snippet markers (TestTestingDocShowsTheExamples checks it).

var archiveMigrations = fstest.MapFS{"00001_archive.sql": {Data: []byte(`-- +goose Up
CREATE TABLE archive (invoice_id TEXT NOT NULL);
CREATE TABLE invoice_log (invoice_id TEXT NOT NULL, status TEXT NOT NULL);
-- +goose Down
DROP TABLE invoice_log;
DROP TABLE archive;
`)}}

// archive archives each invoice sent: a row per effect.
func archive(db *sqlx.DB) framework.Handler {
	return framework.Handle(InvoiceSent, func(ctx context.Context, ev framework.Event[InvoiceSentV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO archive (invoice_id) VALUES (?)`), ev.Data.InvoiceID)
		return err
	})
}

// archived counts the archive's rows.
func archived(t testing.TB, kit *testkit.Kit) int {
	var n int
	if err := kit.DB().Get(&n, `SELECT count(*) FROM archive`); err != nil {
		t.Fatalf("count archive: %v", err)
	}
	return n
}

type StatusChangedV1 struct {
	Status string `json:"status" validate:"required"`
}

var StatusChanged = framework.Define[StatusChangedV1]("billing.invoice.status-changed", 1)

// statusOf is the status change number seq of invoice inv.
func statusOf(t testing.TB, inv string, seq int64, status string) framework.Envelope {
	return testkit.Envelope(t, StatusChanged, StatusChangedV1{Status: status},
		framework.Attributes{ID: fmt.Sprintf("%s-%d", inv, seq), Subject: inv, SubjectSeq: seq})
}

// logStatus logs each status an invoice takes: a row per effect.
func logStatus(db *sqlx.DB) framework.Handler {
	return framework.Handle(StatusChanged, func(ctx context.Context, ev framework.Event[StatusChangedV1]) error {
		_, err := framework.Conn(ctx, db).ExecContext(ctx, db.Rebind(`INSERT INTO invoice_log (invoice_id, status) VALUES (?, ?)`), ev.Subject, ev.Data.Status)
		return err
	})
}

// statuses returns the statuses logged, in the order they took effect.
func statuses(t testing.TB, kit *testkit.Kit) []string {
	var s []string
	if err := kit.DB().Select(&s, `SELECT status FROM invoice_log ORDER BY rowid`); err != nil {
		t.Fatalf("read invoice log: %v", err)
	}
	return s
}

// A delivery that dies before its commit leaves nothing behind: the
// redelivery is processed, and the invoice is archived once.
func Example_crashBeforeCommit() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	// snippet:begin crash-before-commit
	kit := testkit.New(t, testkit.Config{Migrations: archiveMigrations})
	c := kit.Chain(t, "billing.archive-invoice", archive(kit.DB()))
	env := testkit.Envelope(t, InvoiceSent, InvoiceSentV1{InvoiceID: "inv-1", Customer: "ada"}, framework.Attributes{})

	res := c.DeliverCrashing(ctx, t, env, testkit.BeforeCommit) // the process dies before the commit
	fmt.Println(res, "- archived:", archived(t, kit))
	res = c.Redeliver(ctx, t, env) // the broker delivers it again
	testkit.RequireProcessed(t, res)
	fmt.Println(res, "- archived:", archived(t, kit))
	// snippet:end crash-before-commit

	// Output:
	// crashed at before_commit - archived: 0
	// processed after 1 attempts - archived: 1
}

// A delivery that dies after its commit, before the ack, took effect: the
// redelivery is a duplicate, and the invoice is archived once.
func Example_crashAfterCommit() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	// snippet:begin crash-after-commit
	kit := testkit.New(t, testkit.Config{Migrations: archiveMigrations})
	c := kit.Chain(t, "billing.archive-invoice", archive(kit.DB()))
	env := testkit.Envelope(t, InvoiceSent, InvoiceSentV1{InvoiceID: "inv-1", Customer: "ada"}, framework.Attributes{})

	res := c.DeliverCrashing(ctx, t, env, testkit.AfterCommit) // the ack is lost
	fmt.Println(res, "- archived:", archived(t, kit))
	res = c.Redeliver(ctx, t, env)
	testkit.RequireDuplicate(t, res)
	fmt.Println(res, "- archived:", archived(t, kit))
	// snippet:end crash-after-commit

	// Output:
	// crashed at after_commit - archived: 1
	// duplicate after 1 attempts - archived: 1
}

// Under group commit, deliveries share a transaction: when one of them
// dies, its process takes the whole batch down, and every delivery of the
// batch comes back. Here the batch holds three invoices, the second dies
// before the commit.
func Example_crashInBatch() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	// snippet:begin crash-in-batch
	kit := testkit.New(t, testkit.Config{
		Migrations: archiveMigrations,
		Settings: middleware.Settings{
			BatchSize:   3,
			BatchLinger: time.Hour,     // the batch starts once it holds 3 attempts
			Timeout:     2 * time.Hour, // attempts wait for their batch within their time limit
		},
	})
	c := kit.Chain(t, "billing.archive-invoice", archive(kit.DB()))
	var envs []framework.Envelope
	for _, id := range []string{"inv-1", "inv-2", "inv-3"} {
		envs = append(envs, testkit.Envelope(t, InvoiceSent, InvoiceSentV1{InvoiceID: id, Customer: "ada"}, framework.Attributes{}))
	}
	dies := testkit.WithCrashHook(ctx, func(ctx context.Context, at testkit.CrashPoint) bool {
		env, _ := framework.EnvelopeFromContext(ctx)
		return at == testkit.BeforeCommit && env.ID == envs[1].ID
	})

	for _, res := range c.DeliverTogether(dies, t, envs...) {
		fmt.Println(res)
	}
	fmt.Println("archived:", archived(t, kit))
	for _, res := range c.DeliverTogether(ctx, t, envs...) { // delivered again
		fmt.Println(res)
	}
	fmt.Println("archived:", archived(t, kit))
	// snippet:end crash-in-batch

	// Output:
	// crashed at before_commit
	// crashed at before_commit
	// crashed at before_commit
	// archived: 0
	// processed after 1 attempts
	// processed after 1 attempts
	// processed after 1 attempts
	// archived: 3
}

// With skip_stale, the checkpoint of a subject commits with the effect:
// after a death past the commit, an older event is stale and the
// redelivery a duplicate.
func Example_crashSkipStale() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	// snippet:begin crash-skip-stale
	kit := testkit.New(t, testkit.Config{Migrations: archiveMigrations, Settings: middleware.Settings{SkipStale: true}})
	c := kit.Chain(t, "billing.log-status", logStatus(kit.DB()))
	paid := statusOf(t, "inv-1", 2, "paid")

	fmt.Println(c.DeliverCrashing(ctx, t, paid, testkit.AfterCommit))
	fmt.Println(c.Deliver(ctx, t, statusOf(t, "inv-1", 1, "sent"))) // older than paid
	fmt.Println(c.Redeliver(ctx, t, paid))
	fmt.Println(statuses(t, kit))
	// snippet:end crash-skip-stale

	// Output:
	// crashed at after_commit
	// stale after 1 attempts
	// duplicate after 1 attempts
	// [paid]
}

// With strict_order, a death before the commit leaves the subject's
// checkpoint where it was: the next event waits (nacked) until the
// redelivery applies the one that died.
func Example_crashStrictOrder() {
	t := newExampleTB()
	defer t.Done()
	ctx := t.Context()

	// snippet:begin crash-strict-order
	kit := testkit.New(t, testkit.Config{Migrations: archiveMigrations, Settings: middleware.Settings{StrictOrder: true}})
	c := kit.Chain(t, "billing.log-status", logStatus(kit.DB()))
	sent, paid := statusOf(t, "inv-1", 1, "sent"), statusOf(t, "inv-1", 2, "paid")

	fmt.Println(c.Deliver(ctx, t, sent))
	fmt.Println(c.DeliverCrashing(ctx, t, paid, testkit.BeforeCommit))
	fmt.Println(c.Deliver(ctx, t, statusOf(t, "inv-1", 3, "refunded"))) // waits for paid
	fmt.Println(c.Redeliver(ctx, t, paid))
	fmt.Println(c.Redeliver(ctx, t, statusOf(t, "inv-1", 3, "refunded")))
	fmt.Println(statuses(t, kit))
	// snippet:end crash-strict-order

	// Output:
	// processed after 1 attempts
	// crashed at before_commit
	// nacked after 1 attempts: inv-1 #3 waits for #2
	// processed after 1 attempts
	// processed after 1 attempts
	// [sent paid refunded]
}
