package app

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/amqp"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/keypath"
	"github.com/effectively-once/effectively/middleware"
)

// checkConsumers refuses settings under consumers: for a name that no
// declared consumer has, nor had (handlers.RenamedFrom): a typo there
// would leave the consumer on the defaults without a word. The error names
// each such key and lists the declared names. Module runs it at start.
func (c Config) checkConsumers(declared []handlers.Declaration) error {
	known := make(map[string]bool)
	names := make([]string, 0, len(declared))
	for _, d := range declared {
		known[d.Name] = true
		names = append(names, d.Name)
		for _, old := range d.RenamedFrom {
			known[old] = true
		}
	}
	slices.Sort(names)
	list := strings.Join(names, ", ")
	if list == "" {
		list = "none"
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		if !known[name] {
			errs = append(errs, fmt.Errorf("%s: no consumer of this service has that name (declared: %s)", consumerKey(name), list))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("configuration: %w", errors.Join(errs...))
	}
	return nil
}

// Settings returns the settings of the consumer name: its entry under
// consumers:, its zero fields from the defaults: section
// (middleware.Settings.Merge), then the defaults of the transport
// (Concurrency, see DefaultConcurrency) and the framework's
// (middleware.Settings.WithDefaults).
func (c Config) Settings(name string) middleware.Settings {
	return c.effective(c.Consumers[name].Merge(c.Defaults))
}

// effective returns s (a consumer's entry merged with the defaults:
// section, or that section itself) with the defaults of the transport and
// the framework filled in.
func (c Config) effective(s middleware.Settings) middleware.Settings {
	if s.Concurrency == 0 {
		s.Concurrency = c.defaultConcurrency(cmp.Or(s.BatchSize, driver.DefaultBatchSize))
	}
	return s.WithDefaults()
}

// defaultConcurrency is a consumer's concurrency on c's transport, at
// batchSize, when neither its settings nor the defaults: section say.
func (c Config) defaultConcurrency(batchSize int) int {
	switch {
	case batchSize <= 1:
		return DefaultUngroupedConcurrency
	case cmp.Or(c.Transport, DefaultTransport) == TransportSQLite:
		return DefaultSQLiteConcurrency
	}
	return DefaultConcurrency
}

// validateConsumers checks the name of each entry under consumers:, and
// the settings of the defaults: section and of each consumer listed,
// merged with the defaults (middleware.Settings.Validate), each error
// naming its key: defaults.<key> or consumers.<name>.<key>. A problem
// that a consumer's settings share with the defaults (the same message:
// a value the consumer takes from them) is named once, under defaults.
func (c Config) validateConsumers() error {
	defaultsErrs := keypath.Split(c.effective(c.Defaults).Validate())
	inDefaults := make(map[string]bool, len(defaultsErrs))
	for _, err := range defaultsErrs {
		inDefaults[err.Error()] = true
	}
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		if err := validateConsumerName(name); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", consumerKey(name), err))
		}
		var own []error
		for _, err := range keypath.Split(c.Settings(name).Validate()) {
			if !inDefaults[err.Error()] {
				own = append(own, err)
			}
		}
		errs = append(errs, keypath.Prefix(consumerKey(name), errors.Join(own...)))
	}
	errs = append(errs, keypath.Prefix("defaults", errors.Join(defaultsErrs...)))
	return errors.Join(errs...)
}

// validateConsumerName is framework.ValidateConsumerName, whose error
// quotes the name whole: a name longer than it allows is refused without
// it, as its key (consumerKey) shows its first bytes already.
func validateConsumerName(name string) error {
	if len(name) > framework.MaxConsumerNameBytes {
		return fmt.Errorf("consumer name is %d bytes long, at most %d allowed", len(name), framework.MaxConsumerNameBytes)
	}
	return framework.ValidateConsumerName(name)
}

// settingsKeys returns the keys of the consumers' settings, defaults
// first, and the settings of each, defaults filled in: for the defaults,
// those of a consumer not listed.
func (c Config) settingsKeys() (keys []string, settings []middleware.Settings) {
	keys, settings = []string{"defaults"}, []middleware.Settings{c.effective(c.Defaults)}
	for _, name := range slices.Sorted(maps.Keys(c.Consumers)) {
		keys, settings = append(keys, consumerKey(name)), append(settings, c.Settings(name))
	}
	return keys, settings
}

// consumerKey is the key of the settings of consumer name, as errors name
// it: "consumers.<name>", with the name printable and cut (see
// printableKey). A name
// under consumers: is the file's, not yet checked: one with a newline or
// an escape sequence would otherwise break the one-line message, or move
// the terminal's cursor, and no longer read as its key.
func consumerKey(name string) string { return "consumers." + printableKey(name) }

// validateQueueType checks the AMQP queue type and, for quorum queues,
// that their delivery limit is above every consumer's max_deliveries.
func (c Config) validateQueueType() error {
	switch c.AMQPQueueType {
	case "", amqp.QueueClassic:
		return nil
	case amqp.QueueQuorum:
	default:
		return fmt.Errorf("%s: want %s or %s, got %s", setting("amqp_queue_type", EnvAMQPQueueType), amqp.QueueClassic, amqp.QueueQuorum, quoteValue(c.AMQPQueueType))
	}
	limit := cmp.Or(c.AMQPDeliveryLimit, amqp.DefaultDeliveryLimit)
	if limit < 1 || limit > math.MaxInt32 {
		return nil // Validate refuses it, on any transport
	}
	keys, settings := c.settingsKeys()
	var errs []error
	for i, s := range settings {
		if most := s.MaxDeliveries; most >= limit {
			errs = append(errs, fmt.Errorf("amqp_delivery_limit: want more than %s.max_deliveries (%d), so that the framework dead-letters a message before RabbitMQ drops it from its quorum queue, got %d", keys[i], most, limit))
		}
	}
	return errors.Join(errs...)
}
