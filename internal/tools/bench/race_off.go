//go:build !race

package bench

// raceEnabled says that this program runs with the race detector.
const raceEnabled = false
