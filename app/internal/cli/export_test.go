package cli

import "io"

// What the tests of package cli_test use of the unexported views.
var (
	// NewConsumersView is the view of the consumers command.
	NewConsumersView = newConsumersView
	// PrintConsumers prints the view of the consumers command.
	PrintConsumers = printConsumers
)

// SetLagError makes the count of what waits for the view's consumer i
// fail with msg.
func SetLagError(v *consumersView, i int, msg string) { v.Consumers[i].Lag = &lagView{Error: msg} }

// PrintUnknownEvent prints the view of events show for an event the
// database has no record of.
func PrintUnknownEvent(w io.Writer) error { return printEvent(w, eventView{Source: "s", ID: "x"}) }
