package transporttest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
)

// casePublishedAt: every delivered message tells when it was published
// (framework.MetadataPublishedAt, RFC 3339 in UTC): no more than 5s
// before the suite published it, nor more than 1s after its delivery.
// A producer's value of the key, sent as metadata, in a stored row
// (Env.PublishRow) or as a header (Env.PublishHeaders), never comes
// through: it is the transport's word. A plain AMQP client may send no
// timestamp: the message published with headers may then go without.
func casePublishedAt(t *testing.T, s *suite) {
	name := s.consumer("published-at")
	topic := s.topic("a")
	s.start(t, name, 2, nil, topic)
	const forged = "2001-02-03T04:05:06Z"
	body := func(how string) string { return `{"published_at":"` + how + `","case":"` + s.id + `"}` }
	before := time.Now()
	want := []sent{
		{payload: body("plain"), metadata: map[string]string{"tt-note": "no time"}},
		{payload: body("forged metadata"), metadata: map[string]string{framework.MetadataPublishedAt: forged}},
	}
	require.NoError(t, s.env.Transport.Publisher().Publish(topic, newMessage(want[0]), newMessage(want[1])))
	if s.env.PublishRow != nil {
		want = append(want, sent{payload: body("forged row")})
		require.NoError(t, s.env.PublishRow(t, topic, []byte(want[len(want)-1].payload),
			`{"`+framework.MetadataPublishedAt+`":"`+forged+`"}`))
	}
	mayLack := ""
	if s.env.PublishHeaders != nil {
		mayLack = body("forged header")
		want = append(want, sent{payload: mayLack})
		s.env.PublishHeaders(t, topic, []byte(mayLack), map[string]any{framework.MetadataPublishedAt: forged})
	}
	s.waitAcked(t, name, want)
	for _, m := range want {
		ds := s.deliveriesOf(name, m.payload)
		require.NotEmptyf(t, ds, "deliveries of %s", m.payload)
		for _, d := range ds {
			got, ok := d.metadata[framework.MetadataPublishedAt]
			if !ok && m.payload == mayLack {
				continue
			}
			at, err := time.Parse(time.RFC3339Nano, got)
			require.NoErrorf(t, err, "%s of %s", framework.MetadataPublishedAt, m.payload)
			require.Equalf(t, at.UTC().Format(time.RFC3339Nano), got, "%s of %s in UTC", framework.MetadataPublishedAt, m.payload)
			require.WithinRangef(t, at, before.Add(-5*time.Second), d.at.Add(time.Second),
				"%s of %s: published at %s, delivered at %s", framework.MetadataPublishedAt, m.payload, before, d.at)
		}
	}
}
