// Command soakservice is the service that the soak (internal/tools/soak) runs:
// the producer or the two consumers, by EFFECTIVELY_SOAK_ROLE.
package main

import (
	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/internal/tools/soak"
)

func main() {
	app.Main("soakservice", soak.ServiceModule())
}
