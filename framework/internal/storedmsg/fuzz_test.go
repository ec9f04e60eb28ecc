package storedmsg_test

import (
	"bytes"
	"encoding/json"
	"maps"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver/transporttest"
	"github.com/effectively-once/effectively/framework/internal/storedmsg"
	"github.com/effectively-once/effectively/internal/testenv"
)

// FuzzMessage feeds Message any stored row. It never panics and keeps the
// UUID and payload; metadata it reads is a JSON object of strings that
// encodes back to itself, and it never takes from the row what only a
// transport knows (whether this is a redelivery, whether the row is
// unreadable, when it was published); metadata it cannot read
// marks the message unreadable, keeping the text as valid UTF-8 without
// NUL. The seed corpus holds every stored metadata of the bad-input
// catalog.
func FuzzMessage(f *testing.F) {
	seeds := map[string][]any{}
	for _, in := range transporttest.Catalog("notes.note.added") {
		if in.StoredMetadata != "" {
			seeds["catalog-"+in.Name] = []any{"hand-1", in.Body, []byte(in.StoredMetadata)}
		}
	}
	testenv.SeedCorpus(f, seeds)
	f.Add("m-1", []byte(`{}`), []byte(`{"content-type":"application/cloudevents+json"}`))
	f.Add("", []byte(nil), []byte(nil))
	f.Fuzz(func(t *testing.T, uuid string, payload, metadata []byte) {
		msg := storedmsg.Message(uuid, payload, metadata)
		if msg.UUID != uuid || !bytes.Equal(msg.Payload, payload) {
			t.Fatalf("the message is %q %q, the row %q %q", msg.UUID, msg.Payload, uuid, payload)
		}
		for _, k := range []string{framework.MetadataRedelivered, framework.MetadataPublishedAt} {
			if _, ok := msg.Metadata[k]; ok {
				t.Fatalf("the stored row set %s, which only a transport can tell", k)
			}
		}
		if md, reason := storedmsg.Metadata(metadata); reason == "" && msg.Metadata[framework.MetadataUnreadable] != "" {
			t.Fatalf("the stored row %q marked itself unreadable: only the transport does (%q)", md, msg.Metadata)
		}
		md, reason := storedmsg.Metadata(metadata)
		if reason != "" {
			requireUnreadable(t, msg.Metadata, reason)
			return
		}
		delete(md, framework.MetadataRedelivered)
		delete(md, framework.MetadataUnreadable)
		delete(md, framework.MetadataUnreadableRaw)
		delete(md, framework.MetadataPublishedAt)
		if !maps.Equal(md, map[string]string(msg.Metadata)) {
			t.Fatalf("Message's metadata %q, Metadata's %q", msg.Metadata, md)
		}
		text, err := json.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		again, reason := storedmsg.Metadata(text)
		if reason != "" || !maps.Equal(again, md) {
			t.Fatalf("metadata %q encoded as %s reads back as %q (%s)", md, text, again, reason)
		}
	})
}

func requireUnreadable(t *testing.T, md map[string]string, reason string) {
	t.Helper()
	if md[framework.MetadataUnreadable] != reason || len(md) != 2 {
		t.Fatalf("unreadable metadata (%s) delivered as %q", reason, md)
	}
	raw := md[framework.MetadataUnreadableRaw]
	if !utf8.ValidString(raw) || strings.IndexByte(raw, 0) >= 0 {
		t.Fatalf("the kept metadata text %q is not valid UTF-8 without NUL", raw)
	}
}
