package driver_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// TestDataException: a handler's error that is a database's refusal of a
// value (SQLSTATE class 22), however wrapped, is permanent with
// data_exception, unless the handler classified it itself; other
// database errors stay retryable.
func TestDataException(t *testing.T) {
	t.Parallel()
	nul := &pgconn.PgError{Code: "22021", Message: `invalid byte sequence for encoding "UTF8": 0x00`}
	for _, tt := range []struct {
		name string
		err  error
		code framework.Code
	}{
		{"NUL", nul, framework.CodeDataException},
		{"Wrapped", fmt.Errorf("insert reminder: %w", nul), framework.CodeDataException},
		{"TooLong", &pgconn.PgError{Code: "22001"}, framework.CodeDataException},
		{"BadUUID", &pgconn.PgError{Code: "22P02"}, framework.CodeDataException},
		{"UniqueViolation", &pgconn.PgError{Code: "23505"}, framework.CodeRetriesExhausted},
		{"SerializationFailure", &pgconn.PgError{Code: "40001"}, framework.CodeRetriesExhausted},
		{"OwnCode", framework.Permanent("bad_reminder", nul), "bad_reminder"},
		{"Dependency", framework.Dependency(nul), framework.CodeRetriesExhausted},
		{"NotADatabaseError", errors.New("22021"), framework.CodeRetriesExhausted},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := driver.DataException(tt.err)
			require.Equal(t, tt.code, framework.CodeOf(err))
			require.ErrorIs(t, err, tt.err, "the cause is kept")
		})
	}
}
