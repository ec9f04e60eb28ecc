package cli

import (
	"context"
	"fmt"
	"time"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// lagView is what waits for a consumer, all its partitions together, as
// the transport counts it.
type lagView struct {
	// Waiting is the messages waiting, at most the transport's cap per
	// partition; More says a partition's count stopped there.
	Waiting int64 `json:"waiting"`
	More    bool  `json:"waiting_more,omitempty"`
	// OldestSeconds is the age of the oldest message not yet handled, by
	// the database's clock; absent where the transport cannot tell it
	// (amqp: a queue tells no message's age without the management
	// plugin).
	OldestSeconds *float64 `json:"oldest_seconds,omitempty"`
	// Error says why the transport could not count; the rest is then
	// zero.
	Error string `json:"error,omitempty"`
}

// lag counts what waits for d in every partition it runs with.
func (src partitionSource) lag(ctx context.Context, d handlers.Declaration) *lagView {
	backlogs, err := src.backlog(ctx, d, src.cfg.Settings(d.Name).Partitions)
	if err != nil {
		return &lagView{Error: err.Error()}
	}
	v := &lagView{}
	var oldest time.Duration
	known := len(backlogs) > 0
	for _, b := range backlogs {
		v.Waiting += b.Waiting
		v.More = v.More || b.More
		oldest = max(oldest, b.Oldest)
		known = known && b.OldestKnown
	}
	if known {
		s := oldest.Seconds()
		v.OldestSeconds = &s
	}
	return v
}

// waitingCell is the WAITING cell of v: its count, "N+" past the cap, "?"
// when unknown.
func (v *lagView) waitingCell() string {
	switch {
	case v == nil || v.Error != "":
		return "?"
	case v.More:
		return fmt.Sprintf("%d+", v.Waiting)
	}
	return fmt.Sprint(v.Waiting)
}

// oldestCell is the OLDEST cell of v: the age, rounded, "-" when nothing
// waits, "?" when unknown.
func (v *lagView) oldestCell() string {
	switch {
	case v == nil || v.Error != "" || v.OldestSeconds == nil:
		return "?"
	case v.Waiting == 0:
		return "-"
	}
	return time.Duration(*v.OldestSeconds * float64(time.Second)).Round(time.Millisecond).String()
}

// ConsoleLag returns what waits for the consumers of decls as the
// operator console shows it (console.Config.Lag): as the consumers
// command counts it, through counter (nil when the transport counts
// none). A count that fails is said in console.Lag.Error.
func ConsoleLag(cfg Config, counter driver.BacklogCounter, decls []handlers.Declaration) func(ctx context.Context, consumer string) (*console.Lag, error) {
	src, byName := consoleSource(Database{Config: cfg}, counter, decls)
	return func(ctx context.Context, consumer string) (*console.Lag, error) {
		d, ok := byName[consumer]
		if !ok {
			return nil, nil
		}
		v := src.lag(ctx, d)
		return &console.Lag{Waiting: v.waitingCell(), Oldest: v.oldestCell(), Error: v.Error}, nil
	}
}
