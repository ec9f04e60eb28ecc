package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/printable"
)

func printList(out io.Writer, dls []driver.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ID\tCONSUMER\tCODE\tTYPE\tVERSION\tSOURCE\tEVENT\tATTEMPTS\tREPEATS\tLAST FAILED\tSTATUS")
	for _, dl := range dls {
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n",
			dl.ID, dl.Consumer, dl.Code, printable.String(orDash(dl.Type)), dl.Version, printable.String(orDash(dl.Source)), printable.String(dl.EventID),
			dl.Attempts, dl.Repeats, dl.LastFailedAt.UTC().Format(time.RFC3339), dl.Status)
	}
	return w.Flush()
}

func printDeadLetter(out io.Writer, dl driver.DeadLetter) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	row := func(k string, v any) {
		fmt.Fprintf(w, "%s\t%s\n", printable.String(k), printable.String(fmt.Sprint(v)))
	}
	row("id", dl.ID)
	row("consumer", dl.Consumer)
	row("topic", dl.Topic)
	row("code", dl.Code)
	row("status", dl.Status)
	if dl.Status != driver.DeadLetterPending {
		row("resolved", fmt.Sprintf("%s by %s at %s: %s", dl.Resolution.Status, dl.Resolution.By, dl.Resolution.At.UTC().Format(time.RFC3339), dl.Resolution.Reason))
	}
	row("source", orDash(dl.Source))
	row("event id", dl.EventID)
	if dl.Type == "" {
		row("type", "none: the body is not a CloudEvent the consumer could read")
	} else {
		row("type", fmt.Sprintf("%s v%d", dl.Type, dl.Version))
	}
	if dl.SubjectSeq > 0 {
		row("subject", fmt.Sprintf("%s #%d", dl.Subject, dl.SubjectSeq))
	} else {
		row("subject", orDash(dl.Subject))
	}
	row("correlation id", orDash(dl.CorrelationID))
	row("attempts", dl.Attempts)
	row("deliveries", countOrUnknown(dl.Deliveries))
	row("repeats", dl.Repeats)
	row("first failed", dl.FirstFailedAt.UTC().Format(time.RFC3339Nano))
	row("last failed", dl.LastFailedAt.UTC().Format(time.RFC3339Nano))
	keys := make([]string, 0, len(dl.Metadata))
	for k := range dl.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		row("metadata "+k, dl.Metadata[k])
	}
	if err := w.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(out, "body:")
	var pretty bytes.Buffer
	if json.Indent(&pretty, dl.Body, "", "  ") == nil {
		// Indented as it is, not decoded and encoded again, which sorted
		// the members, kept one of two with the same name (the cause of a
		// malformed_envelope) and rounded large numbers.
		for line := range strings.Lines(pretty.String()) {
			fmt.Fprintf(out, "  %s\n", printable.String(strings.TrimSuffix(line, "\n")))
		}
		return nil
	}
	_, err := fmt.Fprintf(out, "  %q\n", dl.Body)
	return err
}

// countOrUnknown prints a delivery count, which is 0 when the store did
// not know it (a message dead-lettered before it was counted).
func countOrUnknown(n int) string {
	if n == 0 {
		return "unknown"
	}
	return strconv.Itoa(n)
}

// printHistory prints every failure and resolution of a dead letter,
// oldest first.
func printHistory(out io.Writer, hs []driver.HistoryEntry) error {
	fmt.Fprintln(out, "history:")
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, h := range hs {
		var what string
		switch h.Kind {
		case driver.HistoryFailed:
			what = fmt.Sprintf("code %s, attempts %d, deliveries %s", h.Code, h.Attempts, countOrUnknown(h.Deliveries))
		case driver.HistoryAdopted:
			what = "from consumer " + h.By
		default:
			what = fmt.Sprintf("by %s: %s", orDash(h.By), h.Reason)
		}
		fmt.Fprintf(w, "  %s\t%s\t%s\n", h.At.UTC().Format(time.RFC3339Nano), h.Kind, printable.String(what))
	}
	return w.Flush()
}

// printParked prints ps per consumer and subject: the dead letter they
// wait behind, their sequences, how many, and how many are ready.
func printParked(out io.Writer, ps []driver.ParkedEvent) error {
	type row struct {
		consumer, subject, held string
		seqs                    []string
		ready                   int
	}
	var rows []*row
	for _, p := range ps {
		if len(rows) == 0 || rows[len(rows)-1].consumer != p.Consumer || rows[len(rows)-1].subject != p.Subject {
			rows = append(rows, &row{consumer: p.Consumer, subject: p.Subject})
		}
		r := rows[len(rows)-1]
		switch {
		case p.Held:
			if r.held != "" {
				r.held += ", "
			}
			r.held += fmt.Sprintf("#%d %s", p.Seq, p.Key)
		default:
			r.seqs = append(r.seqs, strconv.FormatInt(p.Seq, 10))
			if p.Ready {
				r.ready++
			}
		}
	}
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "CONSUMER\tSUBJECT\tHELD\tPARKED\tCOUNT\tREADY")
	for _, r := range rows {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%d\n", r.consumer, printable.String(r.subject), printable.String(orDash(r.held)),
			orDash(strings.Join(r.seqs, " ")), len(r.seqs), r.ready)
	}
	return w.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// timeOrNil returns t in UTC, or nil when it is zero.
func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

// stamp formats t for the operator.
func stamp(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// writeJSON writes v as indented JSON.
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("write JSON: %w", err)
	}
	return nil
}
