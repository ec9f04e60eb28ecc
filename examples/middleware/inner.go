package main

import (
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// errNoTx is what Audit returns outside an attempt's transaction: the
// middleware is in Outer instead of Inner.
var errNoTx = errors.New("audit: no transaction in the context (put Audit in app.Middleware.Inner)")

// snippet:begin set-tenant

// SetTenant is Inner middleware: in each attempt's transaction on
// PostgreSQL, it sets app.tenant for the rest of the transaction, for
// row-level security policies, triggers and defaults that read
// current_setting('app.tenant'). Under group commit the attempts of a
// batch share the transaction: the framework runs RESET ALL after an
// attempt that set something, so the next attempt starts without this
// tenant. SQLite has no such settings: there it does nothing.
func SetTenant(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		if tx, ok := driver.TxFromContext(ctx); ok && tx.DriverName() == "pgx" {
			if _, err := tx.ExecContext(ctx, `SELECT set_config('app.tenant', $1, true)`, TenantFromContext(ctx)); err != nil {
				return nil, fmt.Errorf("set tenant: %w", err)
			}
		}
		return next(msg)
	}
}

// snippet:end set-tenant

// snippet:begin audit

// Audit is Inner middleware: it writes an audit row in the attempt's
// transaction, before the handler runs, so the row commits with the
// handler's effect and the processed mark, or rolls back with them: a
// failed attempt leaves no row, and an event leaves one row however often
// its handler ran (retries, redeliveries, batch re-runs).
func Audit(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		ctx := msg.Context()
		tx, ok := driver.TxFromContext(ctx)
		if !ok {
			return nil, errNoTx
		}
		d, _ := framework.EnvelopeFromContext(ctx)
		if _, err := tx.ExecContext(ctx, tx.Rebind(`INSERT INTO audit_log (tenant, source, event_id, type) VALUES (?, ?, ?, ?)`),
			TenantFromContext(ctx), d.Source, d.ID, d.Type); err != nil {
			return nil, fmt.Errorf("audit: %w", err)
		}
		return next(msg)
	}
}

// snippet:end audit
