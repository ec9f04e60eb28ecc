//go:build !race

package testserver

// RaceEnabled says whether the race detector is on.
const RaceEnabled = false
