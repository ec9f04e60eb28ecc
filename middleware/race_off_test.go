//go:build !race

package middleware_test

// raceAllocs is what the race detector may add to a count of allocations
// (see race_on_test.go): nothing without it.
const raceAllocs = 0
