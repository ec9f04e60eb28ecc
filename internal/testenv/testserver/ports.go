package testserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// Where freePort looks: below the kernel's ephemeral ports, which it
// hands to listeners on port 0 and to the source side of every outgoing
// connection. A server of a test's own is stopped and started again on
// its port; in the ephemeral range, a connection of any test could take
// the port meanwhile, and the server would not start (RabbitMQ's node
// then never answers).
const (
	lowestPort = 10000
	// ephemeralFrom is the start of Linux's default ephemeral range,
	// used when /proc does not say.
	ephemeralFrom = 32768
)

// freePort returns a port of 127.0.0.1 that nothing listens on, chosen at
// random below the ephemeral range (see lowestPort).
func freePort(t *testing.T) int {
	t.Helper()
	high := ephemeralLow()
	for range 100 {
		port := lowestPort + rand.IntN(high-lowestPort)
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue // taken
		}
		require.NoError(t, ln.Close())
		return port
	}
	t.Fatalf("no free port of 127.0.0.1 in [%d, %d) after 100 tries", lowestPort, high)
	return 0
}

// ephemeralLow returns the first ephemeral port of the kernel
// (net.ipv4.ip_local_port_range), or ephemeralFrom when it cannot be
// read or leaves no room below it.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return ephemeralFrom
	}
	var low int
	if _, err := fmt.Sscan(strings.TrimSpace(string(b)), &low); err != nil || low <= lowestPort+1000 {
		return ephemeralFrom
	}
	return low
}
