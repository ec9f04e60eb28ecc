package framework

import (
	"context"
	"errors"
	"fmt"

	wmmiddleware "github.com/ThreeDotsLabs/watermill/message/router/middleware"
)

// PermanentError marks an error that retrying cannot fix: the message is
// dead-lettered at once with Code. Create it with Permanent.
type PermanentError struct {
	Code Code
	Err  error
}

// Permanent marks err as permanent with code: the message is not retried
// but dead-lettered at once. An invalid or empty code becomes
// CodeHandlerFailed. Permanent(code, nil) is a permanent error too.
//
//	if !customer.Exists {
//		return framework.Permanent("unknown_customer", err)
//	}
func Permanent(code Code, err error) error {
	if !code.Valid() {
		code = CodeHandlerFailed
	}
	return &PermanentError{Code: code, Err: err}
}

// Error implements error.
func (e *PermanentError) Error() string {
	if e.Err == nil {
		return "permanent: " + string(e.Code)
	}
	return fmt.Sprintf("permanent (%s): %v", e.Code, e.Err)
}

// Unwrap returns the wrapped error.
func (e *PermanentError) Unwrap() error { return e.Err }

// Is reports whether target is a *PermanentError, so that
// errors.Is(err, &PermanentError{}) finds any permanent error.
func (e *PermanentError) Is(target error) bool {
	_, ok := target.(*PermanentError)
	return ok
}

// IsPermanent reports whether err, or an error it wraps, is permanent.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// CodeOf classifies err for a dead letter: a permanent error's code (an
// invalid or empty one, of a PermanentError made without Permanent, is
// CodeHandlerFailed, as Permanent makes it), then CodePanic for a
// recovered panic, CodeTimeout for an exceeded deadline, and
// CodeRetriesExhausted for anything else. It returns "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var p *PermanentError
	if errors.As(err, &p) {
		if !p.Code.Valid() {
			return CodeHandlerFailed
		}
		return p.Code
	}
	var panicked wmmiddleware.RecoveredPanicError
	if errors.As(err, &panicked) {
		return CodePanic
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return CodeTimeout
	}
	return CodeRetriesExhausted
}

// FieldError is a decode or validation error of one attribute or data
// field, named by its path and never by its value: its text is safe to log
// although payloads may carry personal data. Every decode and validation
// error of the framework (codes malformed_envelope, too_large,
// invalid_payload) wraps one.
//
// A payload's Validate method (see Validator) or an upcast may return one
// to name the field it rejects; any other error they return is reported
// as a rejection of the whole data, its text left out.
//
//	if !strings.Contains(p.Email, "@") {
//		return &framework.FieldError{Field: "email", Reason: "not an e-mail address"}
//	}
type FieldError struct {
	// Field is an attribute ("time", "subjectseq"), "data" or a field of
	// the data ("data.startsAt"), or "body" for the message as a whole.
	Field string
	// Reason says what is wrong without quoting the value, e.g. "not an
	// RFC 3339 time" or "failed required".
	Reason string
	// Err is the cause, which may quote the value: it is reachable with
	// errors.As and errors.Unwrap, and left out of Error.
	Err error
}

// Error returns the field and the reason, never the value.
func (e *FieldError) Error() string { return e.Field + ": " + e.Reason }

// Unwrap returns the cause.
func (e *FieldError) Unwrap() error { return e.Err }

// fieldError returns err's own FieldError when it wraps one, its field
// under prefix; otherwise a FieldError of field with reason, whose text
// leaves err's out.
func fieldError(prefix, field, reason string, err error) *FieldError {
	if fe, ok := errors.AsType[*FieldError](err); ok {
		f := fe.Field
		switch {
		case f == "":
			f = prefix
		case prefix != "":
			f = prefix + "." + f
		}
		return &FieldError{Field: f, Reason: fe.Reason, Err: err}
	}
	return &FieldError{Field: field, Reason: reason, Err: err}
}

// DependencyError marks a failure of something the handler depends on (a
// database, a service it calls) rather than of the message: retrying the
// message later may succeed. It is retried like any error; a consumer's
// circuit breaker (middleware.BreakerConfig) counts it. Create it with
// Dependency.
type DependencyError struct {
	Err error
}

// Dependency marks err as a failure of a dependency: the message is
// retried as usual, and the consumer's circuit breaker, when it has one,
// counts the failure. Dependency(nil) is a dependency failure too.
//
//	if err := client.Reserve(ctx, order); err != nil {
//		return framework.Dependency(fmt.Errorf("reserve stock: %w", err))
//	}
func Dependency(err error) error { return &DependencyError{Err: err} }

// Error implements error.
func (e *DependencyError) Error() string {
	if e.Err == nil {
		return "dependency failed"
	}
	return "dependency failed: " + e.Err.Error()
}

// Unwrap returns the wrapped error.
func (e *DependencyError) Unwrap() error { return e.Err }

// Is reports whether target is a *DependencyError, so that
// errors.Is(err, &DependencyError{}) finds any dependency failure.
func (e *DependencyError) Is(target error) bool {
	_, ok := target.(*DependencyError)
	return ok
}

// IsDependency reports whether err, or an error it wraps, is a dependency
// failure.
func IsDependency(err error) bool {
	var d *DependencyError
	return errors.As(err, &d)
}
