package app

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/app/internal/cli"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// The environment variables of the operator console.
const (
	// EnvConsole turns the console on (true) or off (false).
	EnvConsole = "EFFECTIVELY_CONSOLE"
	// EnvConsoleTokens holds the console's tokens, separated by commas;
	// it replaces the file's console.tokens.
	EnvConsoleTokens = "EFFECTIVELY_CONSOLE_TOKENS"
)

// ConsoleConfig configures the operator console in the browser, served
// under /console/ on HTTPAddr (YAML key console, e.g. console: {enabled:
// true, tokens: [...]}; docs/operations.md, Console). /healthz, /readyz
// and /metrics stay open; every page of the console needs a token.
type ConsoleConfig struct {
	// Enabled serves the console. It needs HTTPAddr and a token.
	// Defaults to false. Env EFFECTIVELY_CONSOLE.
	Enabled bool `yaml:"enabled"`
	// Tokens give access, each "name:secret:read" or
	// "name:secret:write" (console.ParseToken): the name is recorded as
	// who replays or discards, the secret has at least 16 characters.
	// Prefer the environment to a file for secrets. Defaults to none.
	// Env EFFECTIVELY_CONSOLE_TOKENS, comma-separated, which replaces
	// the file's.
	Tokens []string `yaml:"tokens"`
	// TrustedOrigins are origins (scheme://host[:port]) that may send the
	// console's forms besides its own address: a proxy's that changes
	// the Host header (YAML only). Defaults to none.
	TrustedOrigins []string `yaml:"trusted_origins"`
}

// fromEnv reads EFFECTIVELY_CONSOLE and EFFECTIVELY_CONSOLE_TOKENS over
// c.
func (c *ConsoleConfig) fromEnv(lookupEnv func(string) (string, bool)) error {
	if v, _ := lookupEnv(EnvConsole); v != "" {
		b, err := envBool(EnvConsole, v)
		if err != nil {
			return err
		}
		c.Enabled = b
	}
	if v, _ := lookupEnv(EnvConsoleTokens); v != "" {
		c.Tokens = strings.Split(v, ",")
	}
	return nil
}

// validate reports every invalid setting of c, naming its key; the
// errors never quote a secret.
func (c ConsoleConfig) validate(httpAddr string) error {
	var errs []error
	if _, err := console.ParseTokens(c.Tokens); err != nil {
		errs = append(errs, fmt.Errorf("%s: %w", setting("console.tokens", EnvConsoleTokens), err))
	}
	if c.Enabled && len(c.Tokens) == 0 {
		errs = append(errs, fmt.Errorf("%s: the console is enabled without a token: give at least one name:secret:read|write", setting("console.tokens", EnvConsoleTokens)))
	}
	if c.Enabled && httpAddr == "" {
		errs = append(errs, fmt.Errorf("%s: the console is served on %s, which is empty", setting("console.enabled", EnvConsole), EnvHTTPAddr))
	}
	for i, o := range c.TrustedOrigins {
		if err := console.ValidateOrigin(o); err != nil {
			errs = append(errs, fmt.Errorf("console.trusted_origins[%d]: %w", i, err))
		}
	}
	return errors.Join(errs...)
}

// newConsole returns the console of cfg on store, showing the consumers
// of decls and what waits in their partitions on tr.
func newConsole(cfg Config, store driver.Store, tr driver.Transport, decls []handlers.Declaration, logger *slog.Logger) (*console.Console, error) {
	inspector, ok := store.(driver.Inspector)
	if !ok {
		return nil, fmt.Errorf("console: the store %T cannot be inspected (it does not implement driver.Inspector)", store)
	}
	counter, _ := tr.(driver.BacklogCounter) // nil when the transport counts none
	tokens, err := console.ParseTokens(cfg.Console.Tokens)
	if err != nil {
		return nil, fmt.Errorf("console.tokens: %w", err)
	}
	c, err := console.New(console.Config{
		Store:          store,
		Inspector:      inspector,
		Tokens:         tokens,
		TrustedOrigins: cfg.Console.TrustedOrigins,
		Consumers:      cli.ConsoleConsumers(operatorConfig(cfg), decls),
		Transport:      cfg.Transport,
		// The command line's refusals: a consumer not declared here, a
		// dead letter older than processed_retention (the command's
		// --force has no button).
		RefuseReplay: cli.RefuseReplay(operatorConfig(cfg), decls),
		Partitions:   cli.ConsolePartitions(operatorConfig(cfg), store, counter, decls),
		Lag:          cli.ConsoleLag(operatorConfig(cfg), counter, decls),
		Logger:       orDefault(logger),
	})
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return c, nil
}
