package cli

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/printable"
)

// operator is what the dead-letter commands work with: the configuration,
// the database's store and the names of the declared consumers. It builds
// no handler, so nothing a handler's constructor needs or dials, and uses
// the database alone: a replay is recorded there, and the running service
// publishes it (the runner's replay relay, see app/runner).
type operator struct {
	cfg         Config
	deadLetters driver.Store
	consumers   []string
	known       map[string]bool // the declared names and those they are renamed from
	// topics are the declared consumers' topics: their event types and
	// their replay topics.
	topics []string
	// transport opens the service's transport; nil when there is none
	// to open.
	transport func(ctx context.Context) (driver.Transport, error)
}

// newOperator returns the operator of db.
func newOperator(db Database) operator {
	op := operator{cfg: db.Config, deadLetters: db.Store, known: make(map[string]bool), transport: db.Transport}
	seen := make(map[string]bool)
	for _, d := range db.Declarations {
		for _, topic := range append(slices.Clone(d.Types), pipeline.ReplayTopic(d.Name)) {
			if !seen[topic] {
				seen[topic] = true
				op.topics = append(op.topics, topic)
			}
		}
		op.consumers = append(op.consumers, d.Name)
		op.known[d.Name] = true
		for _, old := range d.RenamedFrom {
			op.known[old] = true
		}
	}
	slices.Sort(op.consumers)
	return op
}

// topicPurger opens the service's transport when it keeps tables the
// purge deletes from (the postgres transport), and returns it as a
// driver.TopicPurger; nil for another transport, which is not opened
// (no broker is dialed).
func (op operator) topicPurger(ctx context.Context) (driver.TopicPurger, error) {
	if op.cfg.Transport != transportPostgres || op.transport == nil {
		return nil, nil
	}
	tr, err := op.transport(ctx)
	if err != nil {
		return nil, err
	}
	tp, _ := tr.(driver.TopicPurger)
	return tp, nil
}

// operate opens the service's database (Service.Open), runs fn and
// closes it. The service's application is built, not started: its
// handlers, transport, router and start hooks do not run; the consumers'
// declarations are checked as the service checks them.
func operate(ctx context.Context, s Service, fn func(ctx context.Context, op operator) error) error {
	db, closeDB, err := s.Open()
	if err != nil {
		return err
	}
	defer closeDB()
	return fn(ctx, newOperator(db))
}

// noteUndeclared tells w when the consumer a command filters by is not
// declared (nor renamed from) in this service: a typo there selects
// nothing, silently. It is a note, not an error: the database may hold
// what a consumer removed since left behind.
func (op operator) noteUndeclared(w io.Writer, consumer string) {
	if consumer == "" || op.known[consumer] {
		return
	}
	declared := strings.Join(op.consumers, ", ")
	if declared == "" {
		declared = "none"
	}
	fmt.Fprintf(w, "note: no consumer named %s is declared in this service (declared: %s)\n", printable.String(consumer), declared)
}

// inspection is what the operator's views (events show, consumers) work
// with: the configuration, the store's Inspector and the declared
// consumers, by name. Like the dead-letter commands, it builds no
// handler.
type inspection struct {
	cfg          Config
	inspector    driver.Inspector
	declarations []handlers.Declaration
	// partitions reads the partitioned consumers' leases and backlogs.
	partitions partitionSource
}

// inspect opens the service's database (see operate), runs fn and closes
// it.
func inspect(ctx context.Context, s Service, fn func(ctx context.Context, in inspection) error) error {
	db, closeDB, err := s.Open()
	if err != nil {
		return err
	}
	defer closeDB()
	in, ok := db.Store.(driver.Inspector)
	if !ok {
		return fmt.Errorf("the store %T cannot be inspected (it does not implement driver.Inspector)", db.Store)
	}
	decls := slices.Clone(db.Declarations)
	slices.SortFunc(decls, func(a, b handlers.Declaration) int { return strings.Compare(a.Name, b.Name) })
	return fn(ctx, inspection{cfg: db.Config, inspector: in, declarations: decls, partitions: newPartitionSource(db)})
}

// newPartitionSource returns the source of the partitions of db's
// consumers.
func newPartitionSource(db Database) partitionSource {
	leases, _ := db.Store.(driver.Leases)
	return partitionSource{cfg: db.Config, leases: leases, backlogs: db.Backlogs, now: time.Now}
}
