package middleware_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/internal/pipeline"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/middleware"
)

// fuzzMaxDeliveries is the delivery limit of FuzzChain's consumers.
const fuzzMaxDeliveries = 3

// FuzzChain hands any body and metadata to a consumer's whole chain on a
// real SQLite store (FuzzChainPostgres: on PostgreSQL, whose text refuses
// NUL and invalid UTF-8), as a transport that tells redeliveries (AMQP, the
// SQLite Pub/Sub) or one that cannot (watermill-sql) would deliver it, again
// after each nack. Whatever the input, the chain never panics, and within
// the delivery limit the message ends: processed, its mark stored, or
// dead-lettered with a valid code, its dead letter stored with the
// original body. The handler of notes.note.added v1 acts on the text of
// its data: "fail" fails every attempt, "panic" panics, "reject" fails
// permanently, "later" asks to be delivered again later, and "nack" makes
// an Outer middleware nack the message before the attempts. The seed
// corpus holds every input of the bad-input catalog.
func FuzzChain(f *testing.F) { fuzzChain(f, backendNamed(f, "SQLite")) }

// FuzzChainPostgres is FuzzChain on a PostgreSQL store. Its seeds are
// FuzzChain's: testdata/fuzz/FuzzChainPostgres links to FuzzChain.
func FuzzChainPostgres(f *testing.F) { fuzzChain(f, backendNamed(f, "Postgres")) }

// backendNamed returns the backend of backends named name.
func backendNamed(tb testing.TB, name string) backend {
	for _, b := range backends {
		if b.name == name {
			return b
		}
	}
	tb.Fatalf("no backend %s", name)
	return backend{}
}

// fuzzChain is FuzzChain on the store of b.
func fuzzChain(f *testing.F, b backend) {
	seeds := map[string][]any{}
	for _, in := range transporttest.Catalog(noted.Type()) {
		seeds["catalog-"+in.Name] = []any{in.Body, catalogMetadata(in), byte(1)}
	}
	testenv.SeedCorpus(f, seeds)
	for _, text := range []string{"hello", "fail", "panic", "reject", "later", "nack"} {
		for _, tells := range []byte{0, 1} {
			f.Add(fuzzNote(f, text), "content-type="+framework.ContentType, tells)
		}
	}

	db, store := b.open(f, nil)
	ctx := context.Background()
	if err := migrate.Up(ctx, db, migrate.Config{}); err != nil {
		f.Fatal(err)
	}
	if _, err := db.Exec(`CREATE TABLE effects (consumer TEXT NOT NULL, source TEXT NOT NULL, event_id TEXT NOT NULL)`); err != nil {
		f.Fatal(err)
	}
	insert := db.Rebind(`INSERT INTO effects (consumer, source, event_id) VALUES (?, ?, ?)`)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{DB: db, Store: store})
	if err != nil {
		f.Fatal(err)
	}
	var consumers atomic.Int64
	f.Fuzz(func(t *testing.T, body []byte, metadata string, mode byte) {
		name := fmt.Sprintf("fuzz.c%d", consumers.Add(1))
		c, err := framework.NewConsumer(name, framework.Handle(noted, func(ctx context.Context, ev framework.Event[noteV1]) error {
			switch ev.Data.Text {
			case "fail":
				return errors.New("fails every attempt")
			case "panic":
				panic("the handler panics")
			case "reject":
				return framework.Permanent("note_rejected", nil)
			case "later":
				return pipeline.ErrLater
			}
			_, err := framework.Conn(ctx, db).ExecContext(ctx, insert, name, ev.Source, ev.ID)
			return err
		}))
		if err != nil {
			t.Fatal(err)
		}
		h, _, err := middleware.Handler(middleware.Config{
			Consumer:   c,
			UnitOfWork: uow,
			Store:      store,
			Settings: middleware.Settings{
				MaxDeliveries: fuzzMaxDeliveries,
				Attempts:      2,
				RetryDelay:    time.Microsecond,
				Timeout:       10 * time.Second,
			},
			Outer: []message.HandlerMiddleware{nackNotes},
		})
		if err != nil {
			t.Fatal(err)
		}
		md := parseMetadata(metadata)
		tells := mode%2 == 1
		for delivery := 1; ; delivery++ {
			if delivery > fuzzMaxDeliveries+1 {
				t.Fatalf("still nacked after %d deliveries (the delivery limit is %d)", delivery-1, fuzzMaxDeliveries)
			}
			msg := message.NewMessage(fmt.Sprintf("m-%d", delivery), bytes.Clone(body))
			msg.Metadata = maps.Clone(md)
			delete(msg.Metadata, framework.MetadataRedelivered)
			if tells {
				msg.Metadata.Set(framework.MetadataRedelivered, strconv.FormatBool(delivery > 1))
			}
			msg.SetContext(ctx)
			err := h(msg)
			report, ok := middleware.ReportOf(msg)
			if !ok {
				t.Fatalf("delivery %d: no report (error %v)", delivery, err)
			}
			if err != nil {
				if report.Outcome != framework.Nacked {
					t.Fatalf("delivery %d: error %v reported as %s", delivery, err, report.Outcome)
				}
				continue
			}
			requireEnded(t, store, db, name, body, report)
			return
		}
	})
}

// requireEnded checks that the message the chain acknowledged with report
// left its trace in the store.
func requireEnded(t *testing.T, st store, db *sqlx.DB, consumer string, body []byte, report middleware.Report) {
	t.Helper()
	ctx := context.Background()
	dls, err := st.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer})
	if err != nil {
		t.Fatal(err)
	}
	var marks int
	if err := db.Get(&marks, db.Rebind(`SELECT count(*) FROM processed_events WHERE consumer = ?`), consumer); err != nil {
		t.Fatal(err)
	}
	switch report.Outcome {
	case framework.Processed:
		if marks != 1 || len(dls) != 0 {
			t.Fatalf("processed, yet %d processed marks and %d dead letters", marks, len(dls))
		}
	case framework.DeadLettered:
		if !report.Code.Valid() {
			t.Fatalf("dead-lettered with the invalid code %q", report.Code)
		}
		if marks != 0 || len(dls) != 1 {
			t.Fatalf("dead-lettered (%s), yet %d processed marks and %d dead letters", report.Code, marks, len(dls))
		}
		dl := dls[0]
		if dl.Code != report.Code || !bytes.Equal(dl.Body, body) {
			t.Fatalf("the dead letter has code %s and body %q; the message %s and %q", dl.Code, dl.Body, report.Code, body)
		}
	default:
		t.Fatalf("acknowledged as %s", report.Outcome)
	}
}

// nackNotes nacks, before the attempts, every note whose text is "nack".
func nackNotes(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		var note noteV1
		if d, ok := framework.EnvelopeFromContext(msg.Context()); ok && json.Unmarshal(d.Data, &note) == nil && note.Text == "nack" {
			return nil, errors.New("nacked before the attempts")
		}
		return next(msg)
	}
}

// fuzzNote returns the body of a note event with text.
func fuzzNote(tb testing.TB, text string) []byte {
	tb.Helper()
	env, err := noted.Envelope(noteV1{Text: text}, framework.Attributes{ID: "fuzz-" + text, Source: "fuzz"})
	if err != nil {
		tb.Fatal(err)
	}
	b, err := framework.Encode(env)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// parseMetadata reads metadata written as lines of key=value.
func parseMetadata(text string) message.Metadata {
	md := make(message.Metadata)
	for line := range strings.SplitSeq(text, "\n") {
		if line == "" {
			continue
		}
		k, v, _ := strings.Cut(line, "=")
		md[k] = v
	}
	return md
}

// catalogMetadata writes the metadata a transport hands the chain for in
// as lines of key=value: stored metadata that is not a JSON object of
// strings is marked unreadable, as the SQL transports do.
func catalogMetadata(in transporttest.BadInput) string {
	md := map[string]string{}
	maps.Copy(md, in.Metadata)
	for k, v := range in.Headers {
		md[k] = fmt.Sprint(v)
	}
	if in.StoredMetadata != "" {
		var stored map[string]*string
		if json.Unmarshal([]byte(in.StoredMetadata), &stored) != nil {
			md[framework.MetadataUnreadable] = "metadata is not a JSON object of strings"
			md[framework.MetadataUnreadableRaw] = in.StoredMetadata
		}
		for k, v := range stored {
			if v != nil {
				md[k] = *v
			}
		}
	}
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(md)) {
		b.WriteString(k + "=" + strings.ReplaceAll(md[k], "\n", " ") + "\n")
	}
	return b.String()
}
