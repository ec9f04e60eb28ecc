//go:build !unix

package migrate

import "context"

// lockFile does nothing where flock is not available: processes that
// share a SQLite file there run the migrate command before they start.
func lockFile(context.Context, string) (func(), error) { return func() {}, nil }
