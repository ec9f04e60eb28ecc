package postgres

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestAckDeadlineFor shows that the ack deadline, not renewed, outlasts a
// message's whole handling by a quarter and a second: 3 attempts of 30s
// with 1s between them (the defaults) give 117.25s.
func TestAckDeadlineFor(t *testing.T) {
	t.Parallel()
	require.Equal(t, 3*31*time.Second*5/4+time.Second, ackDeadlineFor(3*31*time.Second))
}
