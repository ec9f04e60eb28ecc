package framework

import (
	"fmt"
	"regexp"
	"strings"
)

var consumerNamePattern = regexp.MustCompile(`^[a-z][a-z0-9]*([.-][a-z0-9]+)*$`)

// ValidateConsumerName reports whether name can name a consumer: it matches
// ^[a-z][a-z0-9]*([.-][a-z0-9]+)*$, has at most MaxConsumerNameBytes bytes
// and does not start with "amq." (reserved by RabbitMQ). A consumer name is
// an identity: it keys the processed events and names the queue or the
// consumer group, so renaming it starts a consumer that processed nothing.
func ValidateConsumerName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("consumer name is empty")
	case len(name) > MaxConsumerNameBytes:
		return fmt.Errorf("consumer name %q is %d bytes long, at most %d allowed", name, len(name), MaxConsumerNameBytes)
	case !consumerNamePattern.MatchString(name):
		return fmt.Errorf("consumer name %q is malformed: use lower-case words of letters and digits joined by '.' or '-', e.g. notifications.remind-on-appointment-booked", name)
	case strings.HasPrefix(name, "amq."):
		return fmt.Errorf("consumer name %q starts with amq., which RabbitMQ reserves", name)
	}
	return nil
}
