package transporttest

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// ExerciseAdoptGroup checks driver.GroupAdopter on the transport of the
// Envs that open returns, which must implement it: a consumer renamed
// after its old name acknowledged part of a topic, and nacked one
// message for good, goes on where the old name stopped. It is handed what
// the old name had not acknowledged, and none of what it had; a topic the
// old name read and the new one does not is left out. Adopting again
// adopts nothing, as does adopting a name that never consumed; bad names
// are refused.
func ExerciseAdoptGroup(t *testing.T, open func(t *testing.T) *Env) {
	t.Helper()
	t.Run("GoesOnWhereTheOldNameStopped", func(t *testing.T) {
		t.Parallel()
		s := newSuite(t, open(t))
		adopter := groupAdopter(t, s)
		ctx := t.Context()
		topic := s.topic("a")
		old, renamed := s.consumer("old"), s.consumer("new")

		// The old name acknowledges what it read, but one message, which
		// it nacks for as long as it runs (a message in flight when it
		// stopped).
		first := s.publishN(t, topic, "first", 20)
		held := first[7].payload
		s.setBehave(func(d delivery) error {
			if d.consumer == old && d.payload == held {
				return errNack
			}
			return nil
		})
		// It reads a second topic, which the new name does not.
		dropped := s.topic("dropped")
		p := s.start(t, old, 4, nil, topic, dropped)
		s.waitAcked(t, old, append(append(s.publishN(t, dropped, "dropped", 3), first[:7]...), first[8:]...))
		s.waitFor(t, "the held message delivered", func() bool { return len(s.deliveriesOf(old, held)) > 0 })
		p.stop()
		second := s.publishN(t, topic, "second", 5) // while no process runs

		topics := []string{topic, s.topic("other")} // a topic neither read: nothing there
		positions, err := adopter.AdoptGroup(ctx, renamed, old, topics)
		require.NoError(t, err)
		require.NotEmpty(t, positions, "the old name's position in its topic")
		for _, pos := range positions {
			require.Equal(t, renamed, pos.Group, "the positions are the new name's")
			require.True(t, strings.HasSuffix(pos.Table, topic), "only in the topics given: %s", pos.Table)
		}

		q := s.start(t, renamed, 4, nil, topic)
		want := append([]sent{first[7]}, second...)
		s.waitAcked(t, renamed, want)
		settle()
		q.stop()
		// What the old name acknowledged after the held message may come
		// again, as it would to the old name after a restart, on a
		// transport that keeps a group's acknowledged prefix (PostgreSQL);
		// what it acknowledged before, never.
		for _, m := range first[:7] {
			require.Emptyf(t, s.deliveriesOf(renamed, m.payload), "%s, acknowledged by the old name before the held message, handed to the new name", m.payload)
		}
		s.requireIntact(t, renamed, append(want, first[8:]...), want...)

		again, err := adopter.AdoptGroup(ctx, renamed, old, topics)
		require.NoError(t, err)
		require.Empty(t, again, "the new name has its own position now")
	})
	t.Run("NothingToAdopt", func(t *testing.T) {
		t.Parallel()
		s := newSuite(t, open(t))
		adopter := groupAdopter(t, s)
		positions, err := adopter.AdoptGroup(t.Context(), s.consumer("new"), s.consumer("never-ran"), []string{s.topic("a")})
		require.NoError(t, err)
		require.Empty(t, positions)
		for _, names := range [][2]string{{"", "a"}, {"a", ""}, {"a", "a"}} {
			_, err := adopter.AdoptGroup(t.Context(), names[0], names[1], []string{s.topic("a")})
			require.Errorf(t, err, "adopt %q for %q", names[1], names[0])
		}
	})
	t.Run("Canceled", func(t *testing.T) {
		t.Parallel()
		s := newSuite(t, open(t))
		adopter := groupAdopter(t, s)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := adopter.AdoptGroup(ctx, s.consumer("new"), s.consumer("old"), []string{s.topic("a")})
		require.True(t, errors.Is(err, context.Canceled), "a canceled context ends it: %v", err)
	})
}

// groupAdopter returns the suite's transport as a driver.GroupAdopter.
func groupAdopter(t *testing.T, s *suite) driver.GroupAdopter {
	t.Helper()
	a, ok := s.env.Transport.(driver.GroupAdopter)
	require.Truef(t, ok, "%T implements driver.GroupAdopter", s.env.Transport)
	return a
}
