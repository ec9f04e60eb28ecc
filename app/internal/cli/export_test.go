package cli

// What the tests of package cli_test use of the unexported views.
var (
	// NewConsumersView is the view of the consumers command.
	NewConsumersView = newConsumersView
	// PrintConsumers prints the view of the consumers command.
	PrintConsumers = printConsumers
)
