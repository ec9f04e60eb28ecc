// Package keypath names the settings that a validation refuses by their
// keys, as the YAML file writes them ("attempts", "breaker.max_hold"),
// so that each layer that holds the settings (the YAML file's
// consumers.<name>, a Go struct's field) puts its own path before the
// key, once, without parsing messages.
package keypath

import (
	"errors"
	"fmt"
)

// Error is an invalid setting.
type Error struct {
	// Key is the setting's key, dotted ("breaker.max_hold"); empty for a
	// problem of several settings, which Problem names.
	Key string
	// Problem says what is wrong and what is wanted.
	Problem string
}

// Error returns "key: problem", or the problem alone without a key.
func (e *Error) Error() string {
	if e.Key == "" {
		return e.Problem
	}
	return e.Key + ": " + e.Problem
}

// Errorf returns an *Error of key, its problem formatted as fmt.Sprintf
// does.
func Errorf(key, format string, args ...any) error {
	return &Error{Key: key, Problem: fmt.Sprintf(format, args...)}
}

// Split returns the errors that err joins (errors.Join), or err alone;
// nil for nil.
func Split(err error) []error {
	if err == nil {
		return nil
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	return []error{err}
}

// Prefix returns err with prefix before the key of each *Error it is or
// joins: "consumers.a" and "attempts" make "consumers.a.attempts", and a
// problem without a key reads "consumers.a: problem". Other errors read
// "prefix: error". Prefix returns nil for nil.
func Prefix(prefix string, err error) error {
	errs := Split(err)
	out := make([]error, 0, len(errs))
	for _, e := range errs {
		var ke *Error
		switch {
		case !errors.As(e, &ke):
			out = append(out, fmt.Errorf("%s: %w", prefix, e))
		case ke.Key == "":
			out = append(out, &Error{Key: prefix, Problem: ke.Problem})
		default:
			out = append(out, &Error{Key: prefix + "." + ke.Key, Problem: ke.Problem})
		}
	}
	return errors.Join(out...)
}
