package app

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework/driver"
)

// backlogConnectTimeout bounds an operator's command's connection to the
// broker, to count what waits in a consumer's partitions: the command
// answers from the database while the broker is down, after this wait,
// with "?" and the reason where the count would be.
const backlogConnectTimeout = 5 * time.Second

// operatorTransport is the transport an operator's command opens to count
// what waits in the consumers' partitions (cli.Database.Backlogs): opened
// on first use, so that a command that needs none dials no broker.
type operatorTransport struct {
	cfg    Config
	db     *sqlx.DB
	logger *slog.Logger

	mu     sync.Mutex
	opened bool
	tr     driver.Transport // nil until opened, or when opening failed
	err    error
	close  func() error
}

// transport opens the transport, once, and connects it to its broker
// when it has one.
func (o *operatorTransport) transport(ctx context.Context) (driver.Transport, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.opened {
		return o.tr, o.err
	}
	o.opened = true
	tr, closeDB, _, err := openTransport(ctx, o.cfg, o.db, "", o.logger)
	if err != nil {
		o.err = err
		return nil, err
	}
	o.close = func() error { return errors.Join(tr.Close(), closeDB()) }
	if c, ok := tr.(connector); ok {
		ctx, cancel := context.WithTimeout(ctx, backlogConnectTimeout)
		defer cancel()
		if err := connect(ctx, c); err != nil {
			o.err = err
			return nil, err
		}
	}
	o.tr = tr
	return tr, nil
}

// backlogs opens the transport, once, and returns it as a
// driver.BacklogCounter: nil when it is not one.
func (o *operatorTransport) backlogs(ctx context.Context) (driver.BacklogCounter, error) {
	tr, err := o.transport(ctx)
	if err != nil {
		return nil, err
	}
	return backlogCounter(tr), nil
}

// Close closes what backlogs opened.
func (o *operatorTransport) Close() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.close == nil {
		return nil
	}
	err := o.close()
	o.close = nil
	return err
}

// backlogCounter returns tr as a driver.BacklogCounter; nil when it
// counts none.
func backlogCounter(tr driver.Transport) driver.BacklogCounter {
	c, _ := tr.(driver.BacklogCounter)
	return c
}

// topicPurger returns tr as a driver.TopicPurger; nil when it keeps no
// tables the purge deletes from.
func topicPurger(tr driver.Transport) driver.TopicPurger {
	p, _ := tr.(driver.TopicPurger)
	return p
}

// groupAdopter returns tr as a driver.GroupAdopter; nil when it keeps no
// consumer groups' positions.
func groupAdopter(tr driver.Transport) driver.GroupAdopter {
	a, _ := tr.(driver.GroupAdopter)
	return a
}
