//go:build race

package middleware_test

// raceAllocs is what the race detector may add to a count of allocations:
// its sync.Pool drops items at random, which are then allocated anew.
const raceAllocs = 3
