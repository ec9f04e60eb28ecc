package cli

import (
	"bytes"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
)

// TestEventViewNamesOnlyConsumersOfItsType: an event known only by its
// processed marks (which keep no type) lists under "no record" only the
// consumers that receive a type it may have: the one type all the
// consumers that applied it receive, or one of the types they have in
// common, never a consumer of another type. It listed every declared
// consumer.
func TestEventViewNamesOnlyConsumersOfItsType(t *testing.T) {
	decls := []handlers.Declaration{
		{Name: "a", Types: []string{"t1"}},
		{Name: "b", Types: []string{"t1"}},
		{Name: "c", Types: []string{"t2"}},
		{Name: "d", Types: []string{"t1", "t2"}},
		{Name: "e", Types: []string{"t3"}},
	}
	marked := func(consumers ...string) driver.EventRecord {
		rec := driver.EventRecord{Key: framework.Key{Source: "s", ID: "1"}}
		for _, c := range consumers {
			rec.Processed = append(rec.Processed, driver.ProcessedMark{Consumer: c, At: time.Unix(0, 0)})
		}
		return rec
	}
	unmarked := func(v eventView) []string {
		var names []string
		for _, u := range v.Unmarked {
			names = append(names, u.Consumer)
		}
		return names
	}

	v := newEventView(marked("a"), decls)
	require.Equal(t, "t1", v.Type)
	require.True(t, v.TypeInferred)
	require.Equal(t, []string{"b", "d"}, unmarked(v), "the consumers of t1 only")
	var out bytes.Buffer
	require.NoError(t, printEvent(&out, v))
	require.Regexp(t, `(?m)^type\s+t1 \(the only type the consumers that applied it receive\)$`, out.String())
	require.NotContains(t, out.String(), "no record  c")

	v = newEventView(marked("d"), decls)
	require.Empty(t, v.Type)
	require.Equal(t, []string{"t1", "t2"}, v.TypeCandidates)
	require.Equal(t, []string{"a", "b", "c"}, unmarked(v), "a type of d's, not e's t3")
	out.Reset()
	require.NoError(t, printEvent(&out, v))
	require.Regexp(t, `(?m)^type\s+unknown \(a processed mark keeps none\): one of t1, t2$`, out.String())

	v = newEventView(marked("gone", "d", "a"), decls)
	require.Equal(t, "t1", v.Type, "an undeclared consumer narrows nothing")
	require.Equal(t, []string{"b"}, unmarked(v))
}
