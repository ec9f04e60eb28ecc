package console

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// Figures of the dead-letter pages.
const (
	// listPage is how many dead letters the list shows at once.
	listPage = 50
	// countPage is how many dead letters the counts read at once, and
	// countLimit how many at most: past it, the counts say they are
	// partial.
	countPage  = 500
	countLimit = 10_000
	// processedWindow is how far back the consumers view counts
	// processed marks.
	processedWindow = time.Hour
)

// group counts the dead letters of one consumer and code.
type group struct {
	Consumer string
	Code     framework.Code
	Count    int
	// Oldest is the earliest first failure, Latest the latest failure.
	Oldest, Latest time.Time
}

// deadLettersData is the content of the dead-letter list.
type deadLettersData struct {
	// Status, Consumer and Code are the filter ("all": any status).
	Status, Consumer, Code string
	Groups                 []group
	Total                  int
	// Partial says the counts stopped at countLimit dead letters.
	Partial bool
	List    []driver.DeadLetter
	// Next is the id to list after, for the next page; 0 on the last.
	Next int64
	// After is the id this page lists after.
	After int64
}

// deadLetters lists the dead letters of a status, counted by consumer and
// code, and those of the selected consumer and code, oldest first.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := deadLettersData{Status: cmp.Or(q.Get("status"), string(driver.DeadLetterPending)), Consumer: q.Get("consumer"), Code: q.Get("code")}
	f := driver.DeadLetterFilter{Consumer: d.Consumer, Code: framework.Code(d.Code)}
	switch d.Status {
	case "all":
	case string(driver.DeadLetterPending), string(driver.DeadLetterReplayed), string(driver.DeadLetterDiscarded):
		f.Status = driver.DeadLetterStatus(d.Status)
	default:
		c.fail(w, r, nil, http.StatusBadRequest, fmt.Sprintf("status: want pending, replayed, discarded or all, got %q", d.Status))
		return
	}
	if a := q.Get("after"); a != "" {
		after, err := strconv.ParseInt(a, 10, 64)
		if err != nil || after < 0 {
			c.fail(w, r, nil, http.StatusBadRequest, fmt.Sprintf("after: want a dead letter id, got %q", a))
			return
		}
		d.After = after
	}
	var err error
	if d.Groups, d.Total, d.Partial, err = c.count(r, driver.DeadLetterFilter{Status: f.Status}); err != nil {
		c.internal(w, r, "count dead letters", err)
		return
	}
	f.AfterID, f.Limit, f.WithoutBody = d.After, listPage+1, true
	if d.List, err = c.cfg.Store.DeadLetters(r.Context(), f); err != nil {
		c.internal(w, r, "list dead letters", err)
		return
	}
	if len(d.List) > listPage {
		d.List = d.List[:listPage]
		d.Next = d.List[listPage-1].ID
	}
	c.render(w, r, http.StatusOK, "deadletters", d)
}

// count reads the dead letters f selects, up to countLimit, and counts
// them by consumer and code.
func (c *Console) count(r *http.Request, f driver.DeadLetterFilter) (groups []group, total int, partial bool, err error) {
	byKey := make(map[[2]string]*group)
	// The bodies are not read: each may be as large as the transport's
	// limit, and the counts read thousands.
	f.Limit, f.WithoutBody = countPage, true
	for total < countLimit {
		dls, err := c.cfg.Store.DeadLetters(r.Context(), f)
		if err != nil {
			return nil, 0, false, err
		}
		for _, dl := range dls {
			k := [2]string{dl.Consumer, string(dl.Code)}
			g := byKey[k]
			if g == nil {
				g = &group{Consumer: dl.Consumer, Code: dl.Code, Oldest: dl.FirstFailedAt, Latest: dl.LastFailedAt}
				byKey[k] = g
			}
			g.Count++
			if dl.FirstFailedAt.Before(g.Oldest) {
				g.Oldest = dl.FirstFailedAt
			}
			if dl.LastFailedAt.After(g.Latest) {
				g.Latest = dl.LastFailedAt
			}
		}
		total += len(dls)
		if len(dls) < f.Limit {
			break
		}
		f.AfterID = dls[len(dls)-1].ID
	}
	if total >= countLimit {
		// Partial only when one more is there: exactly countLimit dead
		// letters are counted whole.
		f.Limit = 1
		more, err := c.cfg.Store.DeadLetters(r.Context(), f)
		if err != nil {
			return nil, 0, false, err
		}
		partial = len(more) > 0
	}
	for _, k := range slices.SortedFunc(maps.Keys(byKey), func(a, b [2]string) int {
		return cmp.Or(cmp.Compare(a[0], b[0]), cmp.Compare(a[1], b[1]))
	}) {
		groups = append(groups, *byKey[k])
	}
	return groups, total, partial, nil
}

// deadLetterData is the content of one dead letter's page.
type deadLetterData struct {
	DL driver.DeadLetter
	// Body is the body as text: indented when it is JSON, with every
	// byte that is not printable UTF-8 written as an escape.
	Body string
	// BodyNote says what the body is: JSON, text, or bytes that are not
	// UTF-8 or hold control characters.
	BodyNote string
	// Metadata are the metadata, by key.
	Metadata [][2]string
	History  []driver.HistoryEntry
	// Parked counts the events of its subject parked behind it.
	Parked int
	// Refused says why it cannot be replayed now; empty when it can.
	Refused string
	// Done says what the operator just did; Error why it was refused.
	Done, Error string
	// Reason is the reason the operator typed, kept on an error.
	Reason string
}

func (c *Console) deadLetter(w http.ResponseWriter, r *http.Request) {
	id, err := pathID(r)
	if err != nil {
		c.fail(w, r, nil, http.StatusBadRequest, err.Error())
		return
	}
	d, ok := c.loadDeadLetter(w, r, id)
	if !ok {
		return
	}
	// The notice comes with the redirect after the action; a link that
	// carries it to a dead letter of another status shows none.
	switch done := driver.DeadLetterStatus(r.URL.Query().Get("done")); {
	case done != d.DL.Status:
	case done == driver.DeadLetterReplayed:
		d.Done = fmt.Sprintf("Replayed: the running service publishes it to %s alone; should it fail again, the dead letter is pending again.", d.DL.Consumer)
	case done == driver.DeadLetterDiscarded:
		d.Done = "Discarded: it will never be processed."
		if d.Parked > 0 {
			d.Done += fmt.Sprintf(" The %d events parked behind it stay parked: dead-letters discard %d --release-parked applies them.", d.Parked, d.DL.ID)
		}
	}
	c.render(w, r, http.StatusOK, "deadletter", d)
}

// loadDeadLetter reads the dead letter id with its history and what is
// parked behind it, or answers the request and returns false.
func (c *Console) loadDeadLetter(w http.ResponseWriter, r *http.Request, id int64) (deadLetterData, bool) {
	ctx := r.Context()
	dl, err := c.cfg.Store.DeadLetter(ctx, id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		c.fail(w, r, nil, http.StatusNotFound, fmt.Sprintf("dead letter %d: not found", id))
		return deadLetterData{}, false
	case err != nil:
		c.internal(w, r, fmt.Sprintf("dead letter %d", id), err)
		return deadLetterData{}, false
	}
	d := deadLetterData{DL: dl}
	d.Body, d.BodyNote = bodyText(dl.Body)
	for _, k := range slices.Sorted(maps.Keys(dl.Metadata)) {
		d.Metadata = append(d.Metadata, [2]string{k, dl.Metadata[k]})
	}
	if d.History, err = c.cfg.Store.DeadLetterHistory(ctx, id); err != nil {
		c.internal(w, r, fmt.Sprintf("dead letter %d: history", id), err)
		return deadLetterData{}, false
	}
	if dl.Subject != "" {
		ps, err := c.cfg.Store.Parked(ctx, driver.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject})
		if err != nil {
			c.internal(w, r, fmt.Sprintf("dead letter %d: parked events", id), err)
			return deadLetterData{}, false
		}
		d.Parked = len(driver.ParkedBehind(dl, ps))
	}
	if dl.Status == driver.DeadLetterPending {
		d.Refused = c.cfg.RefuseReplay(dl, c.cfg.Now())
	}
	return d, true
}

// resolve returns the handler that replays or discards a dead letter,
// with the form's reason and the token's name as who: through
// Store.ResolveDeadLetter, so of two operators at once one wins, and a
// replay is recorded with the mark.
func (c *Console) resolve(status driver.DeadLetterStatus) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id, err := pathID(r)
		if err != nil {
			c.fail(w, r, nil, http.StatusBadRequest, err.Error())
			return
		}
		op := operatorOf(r)
		reason := strings.TrimSpace(r.PostFormValue("reason"))
		refuse := func(code int, why string) {
			d, ok := c.loadDeadLetter(w, r, id)
			if !ok {
				return
			}
			d.Error, d.Reason = why, reason
			c.render(w, r, code, "deadletter", d)
		}
		if reason == "" {
			refuse(http.StatusBadRequest, fmt.Sprintf("Say why in the reason: it is kept in the dead letter's history. Nothing was %s.", status))
			return
		}
		res := driver.Resolution{Status: status, By: op.token.Name, Reason: reason, At: c.cfg.Now()}
		if err := res.Validate(); err != nil {
			why := err.Error()
			if fe, ok := errors.AsType[*framework.FieldError](err); ok {
				why = "the " + fe.Field + " " + fe.Reason
			}
			refuse(http.StatusBadRequest, fmt.Sprintf("Not %s: %s.", status, why))
			return
		}
		if status == driver.DeadLetterReplayed {
			// The command line's refusals hold here too, so a replay is
			// never recorded unchecked: a failed read refuses it.
			dl, err := c.cfg.Store.DeadLetter(r.Context(), id)
			switch {
			case errors.Is(err, driver.ErrNotFound):
				c.fail(w, r, nil, http.StatusNotFound, fmt.Sprintf("dead letter %d: not found", id))
				return
			case err != nil:
				c.internal(w, r, fmt.Sprintf("%s dead letter %d", status, id), err)
				return
			}
			if dl.Status == driver.DeadLetterPending {
				if why := c.cfg.RefuseReplay(dl, c.cfg.Now()); why != "" {
					refuse(http.StatusConflict, "Not replayed: "+why+".")
					return
				}
			}
		}
		_, err = c.cfg.Store.ResolveDeadLetter(r.Context(), id, res)
		switch {
		case errors.Is(err, driver.ErrNotFound):
			c.fail(w, r, nil, http.StatusNotFound, fmt.Sprintf("dead letter %d: not found", id))
			return
		case errors.Is(err, driver.ErrNotPending):
			refuse(http.StatusConflict, fmt.Sprintf("Not %s: it is not pending any more (see its history).", status))
			return
		case err != nil:
			c.internal(w, r, fmt.Sprintf("%s dead letter %d", status, id), err)
			return
		}
		c.cfg.Logger.Info("console: dead letter "+string(status), "id", id, "operator", op.token.Name)
		http.Redirect(w, r, fmt.Sprintf("%sdead-letters/%d?done=%s", Path, id, status), http.StatusSeeOther)
	}
}

// eventData is the content of the event view.
type eventData struct {
	Source, ID string
	// Asked says a source and id were given.
	Asked  bool
	Record driver.EventRecord
	// Unrecorded are the declared consumers of the event's type (of
	// every type when it is unknown) with no record of it.
	Unrecorded []Consumer
}

// event shows what the store knows of the event ?source=&id=.
func (c *Console) event(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	d := eventData{Source: q.Get("source"), ID: q.Get("id")}
	if d.ID == "" {
		c.render(w, r, http.StatusOK, "event", d)
		return
	}
	d.Asked = true
	rec, err := c.cfg.Inspector.InspectEvent(r.Context(), framework.Key{Source: framework.NormalizeSource(d.Source), ID: d.ID})
	if err != nil {
		c.internal(w, r, "inspect event", err)
		return
	}
	d.Record = rec
	recorded := make(map[string]bool)
	var typ string
	if rec.Outbox != nil {
		typ = rec.Outbox.Type
	}
	for _, m := range rec.Processed {
		recorded[m.Consumer] = true
	}
	for _, dl := range rec.DeadLetters {
		recorded[dl.Consumer] = true
		typ = cmp.Or(typ, dl.Type)
	}
	for _, p := range rec.Parked {
		recorded[p.Consumer] = true
	}
	for _, cons := range c.cfg.Consumers {
		if !recorded[cons.Name] && (typ == "" || slices.Contains(cons.Types, typ)) {
			d.Unrecorded = append(d.Unrecorded, cons)
		}
	}
	c.render(w, r, http.StatusOK, "event", d)
}

// consumerRow is one row of the consumers view.
type consumerRow struct {
	Consumer
	Declared bool
	driver.ConsumerFigures
	// Partitions are a partitioned consumer's; nil for another.
	Partitions *Partitions
	// Lag is what waits for it; nil when unknown.
	Lag *Lag
}

// consumersData is the content of the consumers view.
type consumersData struct {
	Transport string
	Rows      []consumerRow
	Unsent    int64
	// OldestUnsent is when the oldest unsent outbox row was added.
	OldestUnsent time.Time
	Window       time.Duration
}

// consumers shows every declared consumer with its figures, and the names
// no longer declared that still have pending dead letters or parked
// events.
func (c *Console) consumers(w http.ResponseWriter, r *http.Request) {
	rec, err := c.cfg.Inspector.InspectConsumers(r.Context(), c.cfg.Now().Add(-processedWindow))
	if err != nil {
		c.internal(w, r, "inspect consumers", err)
		return
	}
	d := consumersData{Transport: c.cfg.Transport, Unsent: rec.Unsent, OldestUnsent: rec.OldestUnsent, Window: processedWindow}
	figures := make(map[string]driver.ConsumerFigures, len(rec.Consumers))
	for _, f := range rec.Consumers {
		figures[f.Consumer] = f
	}
	for _, cons := range slices.SortedFunc(slices.Values(c.cfg.Consumers), func(a, b Consumer) int { return cmp.Compare(a.Name, b.Name) }) {
		row := consumerRow{Consumer: cons, Declared: true, ConsumerFigures: figures[cons.Name]}
		if c.cfg.Partitions != nil {
			if row.Partitions, err = c.cfg.Partitions(r.Context(), cons.Name); err != nil {
				c.internal(w, r, "read the partitions of "+cons.Name, err)
				return
			}
			if p := row.Partitions; p != nil && p.BacklogError != "" {
				// Its text may name the database's or the broker's internals.
				c.cfg.Logger.Error("console: count what waits in the partitions", "consumer", cons.Name, "error", p.BacklogError)
				p.BacklogError = "the transport could not count them (see the service's log)"
			}
		}
		if c.cfg.Lag != nil {
			if row.Lag, err = c.cfg.Lag(r.Context(), cons.Name); err != nil {
				c.internal(w, r, "read the lag of "+cons.Name, err)
				return
			}
			if l := row.Lag; l != nil && l.Error != "" {
				c.cfg.Logger.Error("console: count what waits for a consumer", "consumer", cons.Name, "error", l.Error)
				l.Error = "the transport could not count them (see the service's log)"
			}
		}
		d.Rows = append(d.Rows, row)
		delete(figures, cons.Name)
	}
	for _, f := range rec.Consumers {
		if _, left := figures[f.Consumer]; left && (f.PendingDeadLetters > 0 || f.Parked > 0) {
			d.Rows = append(d.Rows, consumerRow{Consumer: Consumer{Name: f.Consumer}, ConsumerFigures: f})
		}
	}
	c.render(w, r, http.StatusOK, "consumers", d)
}

// internal logs err and answers 500, without err's text, which may name
// the database's internals.
func (c *Console) internal(w http.ResponseWriter, r *http.Request, what string, err error) {
	c.cfg.Logger.Error("console: "+what, "error", err)
	c.fail(w, r, nil, http.StatusInternalServerError, what+": the store failed (see the service's log)")
}

// stamp formats t for the operator; "-" when zero.
func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format("2006-01-02 15:04:05.000Z")
}

// bodyText returns the body as text to show, and what it is. JSON is
// indented; every byte that is not printable UTF-8 is written as an
// escape (see visible).
func bodyText(body []byte) (text, note string) {
	if len(body) == 0 {
		return "", "empty"
	}
	size := len(body)
	if json.Valid(body) {
		var buf bytes.Buffer
		if json.Indent(&buf, body, "", "  ") == nil {
			body = buf.Bytes()
		}
		note = "JSON"
	}
	switch {
	case !utf8.Valid(body):
		note = strings.TrimSpace(note + " with bytes that are not UTF-8 (shown as \\xNN)")
	case strings.ContainsFunc(string(body), isHidden):
		note = strings.TrimSpace(note + " with control characters (shown as \\xNN or \\uNNNN)")
	case note == "":
		note = "text, not JSON"
	}
	return visible(string(body)), fmt.Sprintf("%s, %d bytes", note, size)
}

// isHidden reports a rune that would not show as itself: a control
// character other than newline and tab, or a format character (such as
// a bidirectional override).
func isHidden(r rune) bool {
	return r != '\n' && r != '\t' && (unicode.IsControl(r) || unicode.Is(unicode.Cf, r))
}

// visible returns s as valid UTF-8 that shows every byte: a byte that is
// not UTF-8 becomes \xNN, a hidden rune (see isHidden) \xNN or \uNNNN.
// The page's template escapes HTML after.
func visible(s string) string {
	if utf8.ValidString(s) && !strings.ContainsFunc(s, isHidden) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && n == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case isHidden(r) && r < 0x100:
			fmt.Fprintf(&b, `\x%02x`, r)
		case isHidden(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// query returns "?k1=v1&k2=v2" for the pairs with a value.
func query(kv ...string) string {
	v := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		if kv[i+1] != "" {
			v.Set(kv[i], kv[i+1])
		}
	}
	if len(v) == 0 {
		return ""
	}
	return "?" + v.Encode()
}
