package transporttest

import (
	"encoding/json"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// caseBadInputs publishes every input of the Catalog the Env can carry,
// with a valid message before each and after the last, in one go. Each
// input reaches the subscriber with its body intact, its metadata intact
// (or, where the transport cannot hold them, with NUL or bytes that are
// not UTF-8 replaced by U+FFFD), and marked unreadable
// (framework.MetadataUnreadable, with the stored text in
// framework.MetadataUnreadableRaw) exactly when its stored metadata
// cannot be read as published. No input stalls the
// subscription: the valid messages all arrive, and it keeps running. A
// transport that keeps payloads and metadata as JSON (Env.StoresJSON) may
// refuse at publish what is not JSON text: no subscriber ever sees it.
func caseBadInputs(t *testing.T, s *suite) {
	name := s.consumer("bad")
	topic := s.topic("bad")
	p := s.start(t, name, 2, nil, topic)
	inputs := Catalog(topic)
	var (
		valid   []sent               // the valid messages around the inputs
		want    []BadInput           // inputs that must reach the subscriber
		bodies  = map[string]bool{}  // the catalog's bodies are distinct
		idle    []string             // inputs the Env cannot carry
		refused = map[string]error{} // inputs the transport refused
		publish = s.env.Transport.Publisher()
	)
	addValid := func(i int) {
		m := sent{payload: fmt.Sprintf(`{"valid":%d}`, i), metadata: map[string]string{"tt-index": fmt.Sprint(i)}}
		require.NoError(t, publish.Publish(topic, newMessage(m)))
		valid = append(valid, m)
	}
	for i, in := range inputs {
		require.False(t, bodies[string(in.Body)], "input %s repeats a body", in.Name)
		bodies[string(in.Body)] = true
		addValid(i)
		carried, err := s.env.Publish(t, topic, in)
		switch {
		case !carried:
			idle = append(idle, in.Name)
		case err != nil:
			refused[in.Name] = err
		default:
			want = append(want, in)
		}
	}
	addValid(len(inputs))
	t.Logf("%d inputs delivered, %d refused at publish, %d the transport cannot carry (%s)",
		len(want), len(refused), len(idle), strings.Join(idle, ", "))

	deadline := time.Now().Add(s.env.Timeout)
	// Every delivery counts: a body that arrived changed ends the wait as
	// well, and is reported below.
	for len(s.ackedOf(name)) < len(valid)+len(want) {
		if time.Now().After(deadline) {
			s.reportInputs(t, name, want, valid)
			t.Fatalf("timed out after %s waiting for %d messages", s.env.Timeout, len(valid)+len(want))
		}
		time.Sleep(20 * time.Millisecond)
	}
	settle()
	s.reportInputs(t, name, want, valid)
	select {
	case <-p.done:
		t.Error("the subscription stopped")
	default:
	}
}

// Publish publishes in to topic as it says, when e can carry it (an input
// with typed headers needs PublishHeaders, one with stored metadata
// PublishRow). refused is the error of a publish that e refuses, which
// only a transport that StoresJSON may do, for an input that is not JSON
// text; any other publish error fails the test. The suite behind the
// runner publishes the catalog with it too.
func (e *Env) Publish(t *testing.T, topic string, in BadInput) (carried bool, refused error) {
	t.Helper()
	var err error
	switch {
	case in.Headers != nil:
		if e.PublishHeaders == nil {
			return false, nil
		}
		e.PublishHeaders(t, topic, in.Body, in.Headers)
	case in.StoredMetadata != "":
		if e.PublishRow == nil {
			return false, nil
		}
		err = e.PublishRow(t, topic, in.Body, in.StoredMetadata)
	case in.Metadata != nil:
		msg := message.NewMessage(watermill.NewUUID(), in.Body)
		maps.Copy(msg.Metadata, in.Metadata)
		err = e.Transport.Publisher().Publish(topic, msg)
	case e.PublishRow != nil:
		err = e.PublishRow(t, topic, in.Body, "{}")
	default:
		e.PublishRaw(t, topic, in.Body)
	}
	if err != nil {
		storable := jsonText(in.Body) && (in.StoredMetadata == "" || jsonText([]byte(in.StoredMetadata)))
		require.True(t, e.StoresJSON && !storable, "publishing %s failed: %v", in.Name, err)
	}
	return true, err
}

// jsonText reports whether b is JSON text in UTF-8.
func jsonText(b []byte) bool {
	return utf8.Valid(b) && json.Valid(b)
}

// storable returns v with NUL and bytes that are not UTF-8 replaced by
// U+FFFD, as every store holds text.
func storable(v string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(v, "\uFFFD"), "\x00", "\uFFFD")
}

// reportInputs checks that each input of want reached consumer with its
// body intact and its metadata as the input says, that the valid messages
// all arrived intact, and that nothing else did: it reports every input
// that arrived otherwise.
func (s *suite) reportInputs(t *testing.T, consumer string, want []BadInput, valid []sent) {
	t.Helper()
	expected := make(map[string]bool, len(want)+len(valid))
	for _, m := range valid {
		expected[m.payload] = true
		ds := s.deliveriesOf(consumer, m.payload)
		if len(ds) == 0 {
			t.Errorf("valid message %s did not arrive", m.payload)
		}
		for _, d := range ds {
			for k, v := range m.metadata {
				if got := d.metadata.Get(k); got != v {
					t.Errorf("valid message %s: metadata %q is %q, want %q", m.payload, k, got, v)
				}
			}
		}
	}
	for _, in := range want {
		expected[string(in.Body)] = true
		ds := s.deliveriesOf(consumer, string(in.Body))
		if len(ds) == 0 {
			t.Errorf("%s: did not arrive with its body intact", in.Name)
		}
		for _, d := range ds {
			s.checkInput(t, in, d)
		}
	}
	s.mu.Lock()
	got := append([]delivery(nil), s.delivered[consumer]...)
	s.mu.Unlock()
	for _, d := range got {
		if !expected[d.payload] {
			t.Errorf("unexpected message with body %.100q", d.payload)
		}
	}
}

// checkInput checks the metadata of a delivery of in.
func (s *suite) checkInput(t *testing.T, in BadInput, d delivery) {
	t.Helper()
	unreadable := in.Code == framework.CodeUnreadableMessage
	if got := d.metadata.Get(framework.MetadataUnreadable); (got != "") != unreadable {
		t.Errorf("%s: marked unreadable %q, want marked: %t", in.Name, got, unreadable)
	}
	for k, v := range in.Metadata {
		// Intact, or changed only where a store cannot hold it.
		if got := d.metadata.Get(k); got != v && (!utf8.ValidString(got) || storable(got) != storable(v)) {
			t.Errorf("%s: metadata %q is %q, want %q", in.Name, k, got, v)
		}
	}
	for k, v := range in.Kept {
		if got := d.metadata.Get(k); storable(got) != v {
			t.Errorf("%s: metadata %q is %q, want %q (as stored)", in.Name, k, got, v)
		}
	}
}
