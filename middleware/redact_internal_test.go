package middleware

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// TestRedacted: the error a chain returns to the router (which logs it)
// says of a handler's error its type and SQLSTATE, not its text, unless
// LogErrorText; a decode or validation error keeps its own text, and the
// framework's own errors theirs. Each stays itself to errors.Is and As.
func TestRedacted(t *testing.T) {
	pg := &pgconn.PgError{Severity: "ERROR", Code: "22P02", Message: `invalid input syntax for type uuid: "secret-1"`}
	handlers := &handlerError{err: fmt.Errorf("book secret-1: %w", pg)}
	err := redacted(handlers)
	require.Equal(t, handlers.Error(), err.Error(), "its own text to all but slog")
	var logs bytes.Buffer
	slog.New(slog.NewTextHandler(&logs, nil)).Error("Handler returned error", "error", err) // as watermill's router does
	require.Contains(t, logs.String(), `error="the handler's error (error_type *pgconn.PgError, sqlstate 22P02; its text is logged with log_error_text)"`)
	require.NotContains(t, logs.String(), "secret-1")
	require.ErrorIs(t, err, pg)
	require.ErrorAs(t, err, new(*pgconn.PgError))

	fe := &framework.FieldError{Field: "data.at", Reason: "not an RFC 3339 time"}
	err = redacted(&handlerError{err: fmt.Errorf("decode secret-2: %w", fe)})
	value := err.(slog.LogValuer).LogValue().String()
	require.NotContains(t, value, "secret-2")
	require.Contains(t, value, fe.Error())

	own := errors.New("the database is unreachable")
	require.Same(t, own, redacted(own), "the framework's own")
}
