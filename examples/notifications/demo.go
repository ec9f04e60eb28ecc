package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/spf13/cobra"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/middleware"
)

func demoCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Publish demo events (a duplicate and a poison message among them), handle them and print what happened",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := context.WithTimeout(cmd.Context(), 2*time.Minute)
			defer cancel()
			return runDemo(ctx, cmd.OutOrStdout())
		},
	}
}

// runDemo starts the service, publishes three bookings, one of them twice,
// and a poison message, waits until all five are handled and prints what
// became of them.
func runDemo(ctx context.Context, out io.Writer) error {
	var (
		transport driver.Transport
		db        *sqlx.DB
		store     driver.Store
		metrics   *middleware.Metrics
		cfg       app.Config
	)
	events, err := demoEvents()
	if err != nil {
		return err
	}
	// The metrics count every message of the consumer, also the replays
	// of earlier dead letters that the service publishes meanwhile: what
	// became of the demo's own events is read from the consumer's log.
	own := newOutcomeLog(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}), events)
	service := app.New(
		Module,
		fx.Supply(slog.New(own)),
		fx.Decorate(func(c app.Config) app.Config {
			c.AutoMigrate = true // the demo brings its schema along
			if _, set := os.LookupEnv(app.EnvHTTPAddr); !set {
				c.HTTPAddr = "127.0.0.1:0" // never clash with a running service
			}
			return c
		}),
		fx.Populate(&transport, &db, &store, &metrics, &cfg),
	)
	if err := service.Err(); err != nil {
		return err
	}
	if err := service.Start(ctx); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer func() {
		stopCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = service.Stop(stopCtx)
	}()
	fmt.Fprintf(out, "notifications demo: transport %s, database %s\n\n", cfg.Transport, redacted(cfg.DatabaseURL))

	before, err := outcomes(metrics)
	if err != nil {
		return err
	}
	for _, e := range events {
		msg, err := framework.NewMessage(e.env)
		if err != nil {
			return err
		}
		if err := transport.Publisher().Publish(appointments.Booked.Type(), msg); err != nil {
			return fmt.Errorf("publish: %w", err)
		}
		fmt.Fprintf(out, "  published  %-38s %s\n", e.env.ID, e.what)
	}

	// Wait until all five deliveries are acknowledged.
	var got map[framework.Outcome]int
	checked, suspect := time.Now(), -1
	for {
		got = own.outcomes()
		total := 0
		for outcome, n := range got {
			if outcome != framework.Nacked {
				total += n
			}
		}
		if total >= len(events) {
			break
		}
		if time.Since(checked) > time.Second {
			// More reminders than processed, twice a second apart with no
			// progress between: not a commit whose count is on its way.
			checked = time.Now()
			processed := got[framework.Processed]
			more, err := moreReminders(ctx, db, events, processed)
			switch {
			case err != nil:
				return err
			case more && suspect == processed:
				return fmt.Errorf("another consumer %s of this database took the demo's messages (is a notifications serve running on it?): stop it, or run the demo on a database of its own", ConsumerName)
			case more:
				suspect = processed
			default:
				suspect = -1
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the demo events: %w", ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}

	var reminders []struct {
		AppointmentID string `db:"appointment_id"`
		StartsAt      string `db:"starts_at"`
	}
	query, args, err := sqlx.In(`SELECT appointment_id, starts_at FROM reminders WHERE event_id IN (?) ORDER BY appointment_id`, bookingIDs(events))
	if err != nil {
		return err
	}
	if err := db.SelectContext(ctx, &reminders, db.Rebind(query), args...); err != nil {
		return fmt.Errorf("read reminders: %w", err)
	}
	dls, err := store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: ConsumerName, Status: driver.DeadLetterPending, Limit: 1000})
	if err != nil {
		return fmt.Errorf("read dead letters: %w", err)
	}

	after, err := outcomes(metrics)
	if err != nil {
		return err
	}
	others := -len(events)
	for outcome, n := range after {
		if outcome != string(framework.Nacked) {
			others += int(n - before[outcome])
		}
	}

	fmt.Fprintf(out, "\nconsumer %s, the demo's events:\n", ConsumerName)
	fmt.Fprintf(out, "  processed      %d\n", got[framework.Processed])
	fmt.Fprintf(out, "  duplicate      %d  (acknowledged, handler not run)\n", got[framework.Duplicate])
	fmt.Fprintf(out, "  dead-lettered  %d\n", got[framework.DeadLettered])
	if others > 0 {
		fmt.Fprintf(out, "  and %d other message(s) handled meanwhile: replays of earlier dead letters (dead-letters replay), or messages an earlier run left\n", others)
	}
	fmt.Fprintf(out, "\nreminders scheduled by these events: %d (one per booking, none twice)\n", len(reminders))
	for _, r := range reminders {
		fmt.Fprintf(out, "  %s at %s\n", r.AppointmentID, r.StartsAt)
	}
	poison := events[len(events)-1].env
	for _, dl := range dls {
		if dl.EventID == poison.ID {
			fmt.Fprintf(out, "\ndead letter #%d: event %s, code %s, %d attempt(s), status %s\n", dl.ID, dl.EventID, dl.Code, dl.Attempts, dl.Status)
		}
	}
	fmt.Fprintln(out, "\ndemo done.")
	return nil
}

// moreReminders reports whether the database holds more reminders of the
// demo's bookings than the demo processed: another consumer of the same
// name and database (a running serve) took some of the demo's messages,
// and the demo would wait for them in vain.
func moreReminders(ctx context.Context, db *sqlx.DB, events []demoEvent, processed int) (bool, error) {
	query, args, err := sqlx.In(`SELECT count(*) FROM reminders WHERE event_id IN (?)`, bookingIDs(events))
	if err != nil {
		return false, err
	}
	var n int
	if err := db.GetContext(ctx, &n, db.Rebind(query), args...); err != nil {
		return false, fmt.Errorf("read reminders: %w", err)
	}
	return n > processed, nil
}

// bookingIDs returns the event ids of the demo's three bookings, the
// events that schedule a reminder each.
func bookingIDs(events []demoEvent) []any {
	return []any{events[0].env.ID, events[1].env.ID, events[2].env.ID}
}

type demoEvent struct {
	env  framework.Envelope
	what string
}

// demoEvents returns three bookings, the first again as a duplicate, and a
// booking whose data breaks the contract.
func demoEvents() ([]demoEvent, error) {
	starts := time.Now().Add(24 * time.Hour).Truncate(time.Hour).UTC()
	var events []demoEvent
	for i := range 3 {
		id := fmt.Sprintf("appt-%d", i+1)
		env, err := appointments.Booked.Envelope(
			appointments.BookedV1{AppointmentID: id, StartsAt: starts.Add(time.Duration(i) * time.Hour)},
			framework.Attributes{Source: appointments.Source, Subject: id, SubjectSeq: 1},
		)
		if err != nil {
			return nil, err
		}
		events = append(events, demoEvent{env, "booking of " + id})
	}
	events = append(events, demoEvent{events[0].env, "the first booking again: a duplicate"})
	poison := framework.Envelope{
		Attributes: framework.Attributes{
			ID: fmt.Sprintf("poison-%d", time.Now().UnixNano()), Source: appointments.Source,
			Type: appointments.Booked.Type(), Version: appointments.Booked.Version(),
		},
		Data: []byte(`{"startsAt":"tomorrow at ten"}`),
	}
	events = append(events, demoEvent{poison, "a poison message: no appointmentId, startsAt no time"})
	return events, nil
}

// outcomes reads effectively_messages_total of the consumer by outcome,
// gathered through a registry of its own.
func outcomes(m *middleware.Metrics) (map[string]float64, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(m.Messages()); err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	families, err := reg.Gather()
	if err != nil {
		return nil, fmt.Errorf("read metrics: %w", err)
	}
	got := map[string]float64{}
	for _, f := range families {
		for _, metric := range f.GetMetric() {
			labels := map[string]string{}
			for _, l := range metric.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["consumer"] == ConsumerName {
				got[labels["outcome"]] += metric.GetCounter().GetValue()
			}
		}
	}
	return got, nil
}

// outcomeLog is the demo's slog.Handler: it passes errors to next, and
// counts what became of the demo's events from the consumer's lines
// "message handled" (debug) and "message dead-lettered" (warn), by their
// event_id and outcome attributes.
type outcomeLog struct {
	next slog.Handler
	*outcomeCounts
}

type outcomeCounts struct {
	ids map[string]bool // the demo's event ids
	mu  sync.Mutex
	got map[framework.Outcome]int
}

func newOutcomeLog(next slog.Handler, events []demoEvent) *outcomeLog {
	ids := make(map[string]bool, len(events))
	for _, e := range events {
		ids[e.env.ID] = true
	}
	return &outcomeLog{next: next, outcomeCounts: &outcomeCounts{ids: ids, got: map[framework.Outcome]int{}}}
}

// outcomes returns the demo's events counted so far by outcome.
func (c *outcomeCounts) outcomes() map[framework.Outcome]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.got)
}

// Enabled is true at every level: the outcomes are logged at debug.
func (l *outcomeLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *outcomeLog) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == "message handled" || r.Message == "message dead-lettered" {
		var id, outcome string
		r.Attrs(func(a slog.Attr) bool {
			switch a.Key {
			case "event_id":
				id = a.Value.String()
			case "outcome":
				outcome = a.Value.String()
			}
			return true
		})
		if l.ids[id] {
			l.mu.Lock()
			l.got[framework.Outcome(outcome)]++
			l.mu.Unlock()
		}
	}
	if !l.next.Enabled(ctx, r.Level) {
		return nil
	}
	return l.next.Handle(ctx, r)
}

func (l *outcomeLog) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &outcomeLog{next: l.next.WithAttrs(attrs), outcomeCounts: l.outcomeCounts}
}

func (l *outcomeLog) WithGroup(name string) slog.Handler {
	return &outcomeLog{next: l.next.WithGroup(name), outcomeCounts: l.outcomeCounts}
}

// redacted returns the database URL u with its password hidden, as
// url.URL.Redacted writes it: the demo's output is pasted into tickets.
func redacted(u string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return "(a URL that does not parse)"
	}
	return parsed.Redacted()
}
