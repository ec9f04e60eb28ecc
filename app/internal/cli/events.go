package cli

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/internal/printable"
)

// eventsCommand returns the operator's command on one event.
func eventsCommand(s Service) *cobra.Command {
	root := &cobra.Command{
		Use:   "events",
		Short: "What happened to an event",
	}
	var asJSON bool
	show := &cobra.Command{
		Use:   "show SOURCE ID",
		Short: "Show what the database knows of one event: produced, applied, dead-lettered, parked",
		Long: `Show answers, from the service's database, what happened to the event
SOURCE ID (its CloudEvents source and id): whether this service's outbox
holds it (its type, subject, when it was added and sent), which consumers
applied it (their processed marks, and when), which gave up on it (their
dead letters, with code, attempts, repeats, status and history), and
whether it is parked behind an earlier event of its subject (strict_order).
The declared consumers of its type that have no record of it are named.

Where the purge already deleted the evidence (processed marks past
processed_retention, outbox rows past outbox_retention, resolved dead
letters past dead_letter_retention), it says how far: "purged before" a time. With --json it prints the
same as one JSON object.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			key := framework.Key{Source: framework.NormalizeSource(args[0]), ID: args[1]}
			return inspect(cmd.Context(), s, func(ctx context.Context, in inspection) error {
				rec, err := in.inspector.InspectEvent(ctx, key)
				if err != nil {
					return err
				}
				v := newEventView(rec, in.declarations)
				if asJSON {
					return writeJSON(cmd.OutOrStdout(), v)
				}
				return printEvent(cmd.OutOrStdout(), v)
			})
		},
	}
	show.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	root.AddCommand(show)
	return root
}

// eventView is the answer of events show, as printed and as JSON.
type eventView struct {
	Source string `json:"source"`
	ID     string `json:"id"`
	// Known is false when the database holds no record of the event.
	Known bool `json:"known"`
	// Outbox is the event's outbox row, null when there is none.
	Outbox *outboxView `json:"outbox"`
	// OutboxPurgedBefore: outbox rows sent before it may be gone.
	OutboxPurgedBefore *time.Time `json:"outbox_purged_before,omitempty"`
	// Applied are the processed marks of the event.
	Applied []appliedView `json:"applied"`
	// ProcessedPurgedBefore: marks processed before it may be gone.
	ProcessedPurgedBefore *time.Time      `json:"processed_purged_before,omitempty"`
	DeadLetters           []eventDeadView `json:"dead_letters"`
	// DeadLettersPurgedBefore: dead letters resolved before it may be
	// gone, with their history.
	DeadLettersPurgedBefore *time.Time      `json:"dead_letters_purged_before,omitempty"`
	Parked                  []eventParkView `json:"parked"`
	// Type is the event's type: its outbox row's or its dead letters',
	// else the one type that all the consumers that applied it receive
	// (TypeInferred); empty when unknown.
	Type         string `json:"type,omitempty"`
	TypeInferred bool   `json:"type_inferred,omitempty"`
	// TypeCandidates, when Type is unknown, are the types it may have:
	// those that all the consumers that applied it receive (a processed
	// mark keeps no type); none when no consumer applied it.
	TypeCandidates []string `json:"type_candidates,omitempty"`
	// Unmarked are the declared consumers with no record of the event
	// (no mark, no dead letter, not parked) that receive its type, or
	// one of TypeCandidates, or any type when nothing narrows it.
	Unmarked []unmarkedView `json:"unmarked"`
}

type outboxView struct {
	Row        int64      `json:"row"`
	Type       string     `json:"type"`
	Subject    string     `json:"subject,omitempty"`
	SubjectSeq int64      `json:"subject_seq,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	Sent       bool       `json:"sent"`
	SentAt     *time.Time `json:"sent_at,omitempty"`
}

type appliedView struct {
	Consumer string    `json:"consumer"`
	At       time.Time `json:"at"`
}

type eventDeadView struct {
	ID            int64         `json:"id"`
	Consumer      string        `json:"consumer"`
	Type          string        `json:"type,omitempty"`
	Code          string        `json:"code"`
	Attempts      int           `json:"attempts"`
	Repeats       int           `json:"repeats"`
	Status        string        `json:"status"`
	FirstFailedAt time.Time     `json:"first_failed_at"`
	LastFailedAt  time.Time     `json:"last_failed_at"`
	History       []historyView `json:"history"`
}

type historyView struct {
	At         time.Time `json:"at"`
	Kind       string    `json:"kind"`
	Code       string    `json:"code,omitempty"`
	Attempts   int       `json:"attempts,omitempty"`
	Deliveries int       `json:"deliveries,omitempty"`
	By         string    `json:"by,omitempty"`
	Reason     string    `json:"reason,omitempty"`
}

type eventParkView struct {
	Consumer string `json:"consumer"`
	Subject  string `json:"subject"`
	Seq      int64  `json:"seq"`
	// Held: the event is a dead letter that later events of its subject
	// wait behind; else it is parked behind one.
	Held  bool      `json:"held"`
	Ready bool      `json:"ready"`
	Since time.Time `json:"since"`
}

type unmarkedView struct {
	Consumer string `json:"consumer"`
	// WithoutDedup is the reason the consumer keeps no marks, if it
	// keeps none.
	WithoutDedup string `json:"without_dedup,omitempty"`
}

// newEventView returns the view of rec, naming the consumers of decls
// that have no record of the event.
func newEventView(rec driver.EventRecord, decls []handlers.Declaration) eventView {
	v := eventView{
		Source: rec.Key.Source, ID: rec.Key.ID, Known: rec.Known(),
		Applied: []appliedView{}, DeadLetters: []eventDeadView{}, Parked: []eventParkView{}, Unmarked: []unmarkedView{},
	}
	recorded := make(map[string]bool)
	var typ string
	if o := rec.Outbox; o != nil {
		typ = o.Type
		v.Outbox = &outboxView{
			Row: o.ID, Type: o.Type, Subject: o.Subject, SubjectSeq: o.SubjectSeq,
			CreatedAt: o.CreatedAt.UTC(), Sent: !o.SentAt.IsZero(), SentAt: timeOrNil(o.SentAt),
		}
	} else {
		v.OutboxPurgedBefore = timeOrNil(rec.Horizons.Outbox)
	}
	for _, m := range rec.Processed {
		recorded[m.Consumer] = true
		v.Applied = append(v.Applied, appliedView{Consumer: m.Consumer, At: m.At.UTC()})
	}
	for _, dl := range rec.DeadLetters {
		recorded[dl.Consumer] = true
		typ = cmp.Or(typ, dl.Type)
		d := eventDeadView{
			ID: dl.ID, Consumer: dl.Consumer, Type: dl.Type, Code: string(dl.Code), Attempts: dl.Attempts,
			Repeats: dl.Repeats, Status: string(dl.Status), FirstFailedAt: dl.FirstFailedAt.UTC(), LastFailedAt: dl.LastFailedAt.UTC(),
			History: []historyView{},
		}
		for _, h := range dl.History {
			d.History = append(d.History, historyView{
				At: h.At.UTC(), Kind: string(h.Kind), Code: string(h.Code),
				Attempts: h.Attempts, Deliveries: h.Deliveries, By: h.By, Reason: h.Reason,
			})
		}
		v.DeadLetters = append(v.DeadLetters, d)
	}
	v.DeadLettersPurgedBefore = timeOrNil(rec.Horizons.DeadLetters)
	for _, p := range rec.Parked {
		recorded[p.Consumer] = true
		v.Parked = append(v.Parked, eventParkView{
			Consumer: p.Consumer, Subject: p.Subject, Seq: p.Seq,
			Held: p.Held, Ready: p.Ready, Since: p.At.UTC(),
		})
	}
	v.Type = typ
	if typ == "" {
		v.TypeCandidates = appliedTypes(rec.Processed, decls)
		if len(v.TypeCandidates) == 1 {
			v.Type, v.TypeInferred, v.TypeCandidates = v.TypeCandidates[0], true, nil
		}
	}
	for _, d := range decls {
		switch {
		case recorded[d.Name]:
		case v.Type != "" && !slices.Contains(d.Types, v.Type):
		case v.TypeCandidates != nil && !slices.ContainsFunc(d.Types, func(t string) bool { return slices.Contains(v.TypeCandidates, t) }):
		default:
			v.Unmarked = append(v.Unmarked, unmarkedView{Consumer: d.Name, WithoutDedup: d.WithoutDedup})
		}
	}
	if len(v.Unmarked) > 0 || len(v.Applied) == 0 {
		v.ProcessedPurgedBefore = timeOrNil(rec.Horizons.Processed)
	}
	return v
}

// appliedTypes returns the types that every declared consumer that
// applied the event receives, sorted: the types the event may have, as a
// processed mark keeps none. Nil when no declared consumer applied it.
func appliedTypes(marks []driver.ProcessedMark, decls []handlers.Declaration) []string {
	var (
		types []string
		seen  bool
	)
	for _, m := range marks {
		j := slices.IndexFunc(decls, func(d handlers.Declaration) bool { return d.Name == m.Consumer })
		switch {
		case j < 0: // a consumer no longer declared: its types are not known
		case !seen:
			types, seen = append([]string{}, decls[j].Types...), true
		default:
			types = slices.DeleteFunc(types, func(t string) bool { return !slices.Contains(decls[j].Types, t) })
		}
	}
	return types
}

// printEvent prints v for the operator.
func printEvent(out io.Writer, v eventView) error {
	key := framework.Key{Source: v.Source, ID: v.ID}
	if !v.Known {
		var b strings.Builder
		fmt.Fprintf(&b, "no record of event %s in this service's database\n", printable.String(key.String()))
		if v.ProcessedPurgedBefore != nil {
			fmt.Fprintf(&b, "marks processed before %s are purged: a consumer may have applied it before\n", stamp(*v.ProcessedPurgedBefore))
		}
		if v.OutboxPurgedBefore != nil {
			fmt.Fprintf(&b, "outbox rows sent before %s are purged: it may have been produced and sent before\n", stamp(*v.OutboxPurgedBefore))
		}
		if v.DeadLettersPurgedBefore != nil {
			fmt.Fprintf(&b, "dead letters resolved before %s are purged: a consumer may have dead-lettered it before\n", stamp(*v.DeadLettersPurgedBefore))
		}
		_, err := io.WriteString(out, b.String())
		return err
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k, format string, args ...any) {
		fmt.Fprintf(w, "%s\t%s\n", k, printable.String(fmt.Sprintf(format, args...)))
	}
	row("event", "%s", key)
	switch o := v.Outbox; {
	case o != nil:
		subject := ""
		if o.Subject != "" {
			subject = fmt.Sprintf(", subject %s #%d", o.Subject, o.SubjectSeq)
		}
		sent := "not sent yet"
		if o.SentAt != nil {
			sent = "sent " + stamp(*o.SentAt)
		}
		row("produced", "outbox row %d, type %s%s, created %s, %s", o.Row, o.Type, subject, stamp(o.CreatedAt), sent)
	case v.OutboxPurgedBefore != nil:
		row("produced", "no outbox row: purged before %s (rows sent before then are deleted), or another service produced it", stamp(*v.OutboxPurgedBefore))
	default:
		row("produced", "no outbox row: another service produced it")
	}
	switch {
	case v.Outbox != nil:
	case v.TypeInferred:
		row("type", "%s (the only type the consumers that applied it receive)", v.Type)
	case v.Type != "":
		row("type", "%s", v.Type)
	case len(v.TypeCandidates) > 0:
		row("type", "unknown (a processed mark keeps none): one of %s", strings.Join(v.TypeCandidates, ", "))
	default:
		row("type", "unknown (a processed mark keeps none)")
	}
	for _, a := range v.Applied {
		row("applied", "%s at %s", a.Consumer, stamp(a.At))
	}
	for _, u := range v.Unmarked {
		if u.WithoutDedup != "" {
			row("no record", "%s (without deduplication, it keeps no mark: %s)", u.Consumer, u.WithoutDedup)
			continue
		}
		row("no record", "%s (not applied yet, or its mark purged)", u.Consumer)
	}
	if v.ProcessedPurgedBefore != nil {
		row("purged", "marks processed before %s", stamp(*v.ProcessedPurgedBefore))
	}
	if v.DeadLettersPurgedBefore != nil {
		row("purged", "dead letters resolved before %s, with their history", stamp(*v.DeadLettersPurgedBefore))
	}
	for _, p := range v.Parked {
		what := fmt.Sprintf("#%d of subject %s, parked until the events before it take effect (one is a dead letter, or has not arrived)", p.Seq, p.Subject)
		if p.Held {
			what = fmt.Sprintf("a dead letter the later events of subject %s wait behind (#%d)", p.Subject, p.Seq)
		} else if p.Ready {
			what += ", ready: its turn has come"
		}
		row("parked", "%s: %s, since %s", p.Consumer, what, stamp(p.Since))
	}
	if err := w.Flush(); err != nil {
		return err
	}
	for _, d := range v.DeadLetters {
		fmt.Fprintf(out, "dead letter %d of %s: %s, code %s, %d attempts, %d repeats, first failed %s, last failed %s\n",
			d.ID, d.Consumer, d.Status, d.Code, d.Attempts, d.Repeats, stamp(d.FirstFailedAt), stamp(d.LastFailedAt))
		w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
		for _, h := range d.History {
			fmt.Fprintf(w, "  %s\t%s\t%s\n", stamp(h.At), h.Kind, printable.String(historyDetail(h)))
		}
		if err := w.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// historyDetail describes a history entry: a failure's code, attempts
// and deliveries, a resolution's actor and reason, an adoption's old
// name.
func historyDetail(h historyView) string {
	switch driver.HistoryKind(h.Kind) {
	case driver.HistoryFailed:
		s := fmt.Sprintf("code %s, %d attempts", h.Code, h.Attempts)
		if h.Deliveries > 0 {
			s += fmt.Sprintf(", delivery %d", h.Deliveries)
		}
		return s
	case driver.HistoryAdopted:
		return "from " + h.By
	}
	return fmt.Sprintf("by %s: %s", h.By, h.Reason)
}
