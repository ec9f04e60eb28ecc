package app

import "github.com/effectively-once/effectively/handlers"

// What the tests of package app_test use of the unexported wiring.
type (
	// HTTP is the application's server, for its address.
	HTTP = httpServer
	// ReadyzBody is the JSON body of /readyz.
	ReadyzBody = readyzBody
	// ReadyzConsumer is one consumer's entry in ReadyzBody.
	ReadyzConsumer = readyzConsumer
	// ServiceName is what Command supplies.
	ServiceName = serviceName
)

// Migrate applies the framework's migrations, then the application's.
var Migrate = migrateUp

// CheckConsumers refuses settings for undeclared consumers.
func (c Config) CheckConsumers(declared []handlers.Declaration) error {
	return c.checkConsumers(declared)
}
