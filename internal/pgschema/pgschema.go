// Package pgschema gives a test a PostgreSQL schema of its own on a shared
// server, so that tests run in parallel on one database: the test kits
// (app/testkit, app/apptest) and the benchmarks use it.
package pgschema

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/effectively-once/effectively/framework/postgres"
)

// Schema is a schema created by Create.
type Schema struct {
	// Name is the schema's name.
	Name string
	// URL is the server's URL whose connections use the schema
	// (search_path).
	URL  string
	base string
}

// CheckURL reports whether base can carry a schema: a postgres:// URL
// (a key=value connection string cannot).
func CheckURL(base string) error {
	return parseURL(base)
}

// Create creates a schema named prefix followed by random hex on the
// server at base. Drop it when done.
func Create(ctx context.Context, base, prefix string) (*Schema, error) {
	if err := CheckURL(base); err != nil {
		return nil, err
	}
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		return nil, fmt.Errorf("schema name: %w", err)
	}
	s := &Schema{Name: prefix + hex.EncodeToString(b), base: base}
	if err := exec(ctx, base, "CREATE SCHEMA "+s.Name); err != nil {
		return nil, err
	}
	s.URL = withSearchPath(base, s.Name)
	return s, nil
}

// Drop drops the schema and everything in it.
func (s *Schema) Drop(ctx context.Context) error {
	return exec(ctx, s.base, "DROP SCHEMA "+s.Name+" CASCADE")
}

// exec runs one statement on the server at base, on a connection of its
// own.
func exec(ctx context.Context, base, stmt string) error {
	db, err := postgres.Open(ctx, base, postgres.OpenConfig{MaxOpenConns: 1})
	if err != nil {
		return err
	}
	defer db.Close()
	if _, err := db.ExecContext(ctx, stmt); err != nil {
		return fmt.Errorf("%s: %w", stmt, err)
	}
	return nil
}

// withSearchPath returns the URL base with its search_path set to
// schema: pgx takes the last of a repeated key. The query is appended to
// the string, not rebuilt by net/url, which does not read every URL pgx
// does (a host without a port after one with a port:
// postgres://db-1:5432,db-2/app).
func withSearchPath(base, schema string) string {
	sep := "?"
	switch {
	case strings.HasSuffix(base, "?") || strings.HasSuffix(base, "&"):
		sep = ""
	case strings.Contains(base, "?"):
		sep = "&"
	}
	return base + sep + "search_path=" + schema
}

func parseURL(s string) error {
	if !strings.HasPrefix(s, "postgres://") && !strings.HasPrefix(s, "postgresql://") {
		return errors.New("want a postgres:// URL (key=value connection strings cannot carry the test's schema)")
	}
	if _, err := pgx.ParseConfig(s); err != nil {
		return fmt.Errorf("parse postgres URL: %w", err) // pgx masks the password
	}
	return nil
}
