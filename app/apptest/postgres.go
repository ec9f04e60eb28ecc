package apptest

import (
	"context"
	"fmt"

	"github.com/effectively-once/effectively/internal/pgschema"
)

// createSchema creates a schema of the test's own on the server at
// cfg.PostgresURL, registers its drop with the undo steps, and returns a
// URL whose connections use it.
func (a *App) createSchema(ctx context.Context) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	schema, err := pgschema.Create(ctx, a.cfg.PostgresURL, "apptest_")
	if err != nil {
		return "", fmt.Errorf("apptest: %w", err)
	}
	a.undo = append(a.undo, func(ctx context.Context) error {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), setupTimeout)
		defer cancel()
		return schema.Drop(ctx)
	})
	return schema.URL, nil
}
