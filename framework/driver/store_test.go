package driver_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// TestStorableMetadata: a dead letter's metadata comes from the transport
// as received; what no store can hold, NUL and bytes that are not UTF-8,
// becomes U+FFFD, in keys and values.
func TestStorableMetadata(t *testing.T) {
	t.Parallel()
	in := map[string]string{
		"content-type": framework.ContentType,
		"nul":          "a\x00b",
		"bad-utf8":     "a\xff\xfeb",
		"key\x00":      "v1",
		"key\xff":      "v2",
		"fine":         "café \uFFFD \u0085",
	}
	got := driver.StorableMetadata(in)
	require.Equal(t, map[string]string{
		"content-type": framework.ContentType,
		"nul":          "a\uFFFDb",
		"bad-utf8":     "a\uFFFDb",
		"key\uFFFD":    "v1", // "key\x00" comes first in byte order
		"fine":         "café \uFFFD \u0085",
	}, got)
	require.Equal(t, "a\x00b", in["nul"], "the input is left as it was")
	require.Nil(t, driver.StorableMetadata(nil))
	require.Nil(t, driver.StorableMetadata(map[string]string{}))
}

// TestDeadLetterValidateRefusesUnstorableText: every store refuses alike
// a dead letter whose text fields PostgreSQL could not hold.
func TestDeadLetterValidateRefusesUnstorableText(t *testing.T) {
	t.Parallel()
	valid := driver.DeadLetter{Consumer: "c", Topic: "t", Source: "s", EventID: "e", Code: framework.CodeMalformedEnvelope}
	require.NoError(t, valid.Validate())
	for name, set := range map[string]func(dl *driver.DeadLetter, v string){
		"Consumer":      func(dl *driver.DeadLetter, v string) { dl.Consumer = v },
		"Topic":         func(dl *driver.DeadLetter, v string) { dl.Topic = v },
		"Source":        func(dl *driver.DeadLetter, v string) { dl.Source = v },
		"EventID":       func(dl *driver.DeadLetter, v string) { dl.EventID = v },
		"Type":          func(dl *driver.DeadLetter, v string) { dl.Type = v },
		"Subject":       func(dl *driver.DeadLetter, v string) { dl.Subject = v },
		"CorrelationID": func(dl *driver.DeadLetter, v string) { dl.CorrelationID = v },
	} {
		for _, bad := range []string{"a\x00b", "a\xffb"} {
			dl := valid
			set(&dl, bad)
			err := dl.Validate()
			require.Error(t, err, "%s %q", name, bad)
			require.Contains(t, err.Error(), name)
			require.NotContains(t, err.Error(), bad)
		}
	}
}

// TestParkedBehind: the events parked behind a dead letter are those after
// it while it holds its subject; a dead letter that holds nothing has
// none behind it, whatever else is parked there.
func TestParkedBehind(t *testing.T) {
	key := func(id string) framework.Key { return framework.Key{Source: "orders", ID: id} }
	dl := driver.DeadLetter{Consumer: "c", Source: "orders", EventID: "e5", Subject: "S", SubjectSeq: 5}
	ps := []driver.ParkedEvent{
		{Consumer: "c", Subject: "S", Seq: 3, Key: key("e3"), Held: true},
		{Consumer: "c", Subject: "S", Seq: 4, Key: key("e4")},
		{Consumer: "c", Subject: "S", Seq: 5, Key: key("e5"), Held: true},
		{Consumer: "c", Subject: "S", Seq: 6, Key: key("e6")},
		{Consumer: "c", Subject: "S", Seq: 7, Key: key("e7")},
	}
	var seqs []int64
	for _, p := range driver.ParkedBehind(dl, ps) {
		seqs = append(seqs, p.Seq)
	}
	require.Equal(t, []int64{6, 7}, seqs)

	conflict := dl
	conflict.EventID = "e5-again" // a sequence_conflict dead letter: no hold of its own
	require.Empty(t, driver.ParkedBehind(conflict, ps))
	noSubject := dl
	noSubject.Subject, noSubject.SubjectSeq = "", 0
	require.Empty(t, driver.ParkedBehind(noSubject, ps))
}

// TestParkedEventDeadLetter: the dead letter of a parked event keeps its
// message and takes the event's attributes from its body, one over the
// default body limit too (a consumer may take larger ones); a body that
// is not the event's gives none.
func TestParkedEventDeadLetter(t *testing.T) {
	t.Parallel()
	at := time.Date(2026, 12, 4, 3, 0, 0, 0, time.UTC)
	big := `"` + strings.Repeat("x", framework.DefaultMaxBodyBytes) + `"`
	body, err := framework.Encode(framework.Envelope{
		Attributes: framework.Attributes{
			ID: "e1", Source: "orders", Type: "orders.order.paid", Version: 3,
			Subject: "order-1", SubjectSeq: 4, CorrelationID: "corr-1",
		},
		Data: []byte(`{"note":` + big + `}`),
	})
	require.NoError(t, err)
	require.Greater(t, len(body), framework.DefaultMaxBodyBytes)
	p := driver.ParkedEvent{
		Consumer: "c", Subject: "order-1", Seq: 4, Key: framework.Key{Source: "orders", ID: "e1"},
		Topic: "orders.order.paid", Body: body, Metadata: map[string]string{"traceparent": "t"},
	}
	dl := p.DeadLetter(framework.CodeSequenceConflict, at)
	require.NoError(t, dl.Validate())
	require.True(t, bytes.Equal(body, dl.Body), "the message's body")
	dl.Body = nil // not printed, should the comparison below fail
	require.Equal(t, driver.DeadLetter{
		Consumer: "c", Topic: "orders.order.paid", Source: "orders", EventID: "e1",
		Type: "orders.order.paid", Version: 3, Subject: "order-1", CorrelationID: "corr-1",
		Code: framework.CodeSequenceConflict, SubjectSeq: 4, FirstFailedAt: at, LastFailedAt: at,
		Metadata: map[string]string{"traceparent": "t"}, Status: driver.DeadLetterPending,
	}, dl)

	p.Key.ID = "another"
	dl = p.DeadLetter(framework.CodeSequenceConflict, at)
	require.Empty(t, dl.Type, "a body of another event gives nothing")
	require.Zero(t, dl.Version)
	require.Equal(t, "another", dl.EventID)
}
