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

// ErrLater marks an outcome that is neither success nor failure: the
// message is to be delivered again later, not retried now and not
// dead-lettered (an event waiting for an earlier one of its subject, say).
var ErrLater = errors.New("deliver again later")

// IsPermanent reports whether err, or an error it wraps, is permanent.
func IsPermanent(err error) bool {
	var p *PermanentError
	return errors.As(err, &p)
}

// CodeOf classifies err for a dead letter: a permanent error's code, then
// CodePanic for a recovered panic, CodeTimeout for an exceeded deadline,
// and CodeRetriesExhausted for anything else. It returns "" for nil.
func CodeOf(err error) Code {
	if err == nil {
		return ""
	}
	var p *PermanentError
	if errors.As(err, &p) {
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
