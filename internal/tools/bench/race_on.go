//go:build race

package bench

// raceEnabled says that this program runs with the race detector: the
// example service is then built with it too, from the packages the test
// build compiled already (make test runs TestSmoke with -race).
const raceEnabled = true
