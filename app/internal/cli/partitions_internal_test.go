package cli

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/pipeline"
)

// TestPrintPartitions: the partitions table says the count (and the
// configured one when they differ, with the command to run), the live
// processes, and per partition its owner ("—" when none), token, lease,
// waiting messages ("N+" past the cap, "?" unknown) and positions.
func TestPrintPartitions(t *testing.T) {
	t.Parallel()
	n := func(v int64) *int64 { return &v }
	in := 12.4
	v := partitionsView{
		Count: 3, Configured: 4, Members: []string{"host-1-aa", "host-2-bb"},
		Partitions: []partitionView{
			{
				Partition: 0, Owner: "host-1-aa", Token: 3, LeaseExpiresIn: &in, Waiting: n(0),
				Positions: []positionView{{Topic: "shop.order.placed", Offset: n(1234)}, {Topic: pipeline.ReplayTopic("shop.mail"), Offset: n(0)}},
			},
			{
				Partition: 1, Token: 2, Waiting: n(100000), WaitingMore: true,
				Positions: []positionView{{Topic: "shop.order.placed"}, {Topic: pipeline.ReplayTopic("shop.mail")}},
			},
			{Partition: 2},
		},
	}
	var out bytes.Buffer
	require.NoError(t, printPartitions(&out, "shop.mail", v))
	s := out.String()
	t.Log(s)
	require.Contains(t, s, "consumer shop.mail: 3 partitions (configured: 4; the service refuses to start until the consumers repartition shop.mail 4 command), 2 live processes: host-1-aa, host-2-bb\n")
	require.Regexp(t, `(?m)^PARTITION\s+OWNER\s+TOKEN\s+LEASE EXPIRES IN\s+WAITING\s+POSITION$`, s)
	require.Regexp(t, `(?m)^0\s+host-1-aa\s+3\s+12s\s+0\s+shop\.order\.placed@1234 replay@0$`, s)
	require.Regexp(t, `(?m)^1\s+—\s+2\s+—\s+100000\+\s+shop\.order\.placed@- replay@-$`, s)
	require.Regexp(t, `(?m)^2\s+—\s+0\s+—\s+\?\s+-$`, s)

	v.Configured = 1
	out.Reset()
	require.NoError(t, printPartitions(&out, "shop.mail", v))
	require.Contains(t, out.String(), "consumer shop.mail: 3 partitions (configured: unpartitioned, as the service runs it; the consumers repartition shop.mail 1 command records it), 2 live processes")

	v.Configured, v.Members, v.BacklogError = 3, nil, "broker down"
	out.Reset()
	require.NoError(t, printPartitions(&out, "shop.mail", v))
	require.Contains(t, out.String(), "consumer shop.mail: 3 partitions, no live process\n")
	require.Contains(t, out.String(), "waiting messages unknown: broker down\n")
}
