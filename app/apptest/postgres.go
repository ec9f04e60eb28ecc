package apptest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"

	"github.com/effectively-once/effectively/framework/postgres"
)

// createSchema creates a schema of the test's own on the server at
// cfg.PostgresURL, registers its drop with the undo steps, and returns a
// URL whose connections use it.
func (a *App) createSchema(ctx context.Context) (string, error) {
	base := a.cfg.PostgresURL
	u, err := parsePostgresURL(base)
	if err != nil {
		return "", err
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("apptest: schema name: %w", err)
	}
	schema := "apptest_" + hex.EncodeToString(b)
	if err := execAdmin(ctx, base, "CREATE SCHEMA "+schema); err != nil {
		return "", err
	}
	a.undo = append(a.undo, func(ctx context.Context) error {
		return execAdmin(context.WithoutCancel(ctx), base, "DROP SCHEMA "+schema+" CASCADE")
	})
	q := u.Query()
	q.Set("search_path", schema)
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// execAdmin runs one statement on the server at base, on a connection of
// its own.
func execAdmin(ctx context.Context, base, stmt string) error {
	ctx, cancel := context.WithTimeout(ctx, setupTimeout)
	defer cancel()
	db, err := postgres.Open(ctx, base, postgres.OpenConfig{MaxOpenConns: 1})
	if err != nil {
		return fmt.Errorf("apptest: %w", err)
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("apptest: %s: %w", stmt, err)
	}
	return nil
}

func parsePostgresURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("parse postgres URL: %w", err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, errors.New("want a postgres:// URL (key=value connection strings cannot carry the test's schema)")
	}
	return u, nil
}
