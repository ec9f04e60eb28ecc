package amqp

import (
	"context"
	"io"
	"net"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestLostDeliveryIsNotCharged: the messages in flight when the
// connection is lost (a network outage: the test cuts it) come again on
// the next connection as the same deliveries resumed, not flagged
// redelivered, so that the delivery guard does not charge the outage to
// them; a message nacked and delivered again is flagged, and so is a
// lost one's second redelivery.
func TestLostDeliveryIsNotCharged(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled { // watermill-amqp races on a reconnection
		testserver.RerunWithoutRace(t, "TestLostDeliveryIsNotCharged")
		return
	}
	u, err := neturl.Parse(testenv.Require(t, testenv.AMQPURLVar))
	require.NoError(t, err)
	proxy := newCutProxy(t, u.Host)
	u.Host = proxy.addr()
	tr := newTransport(t, TransportConfig{URL: u.String(), NackDelay: 20 * time.Millisecond})
	topic, consumer := "lost.deliveries"+randomSuffix(), "lost-deliveries"+randomSuffix()
	sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 4})
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	for _, id := range []string{"a", "b"} {
		require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage(id, []byte(`{}`))))
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, sub.Topics[0])
	require.NoError(t, err)
	byID := func(n int) map[string]string {
		t.Helper()
		got := map[string]string{}
		for range n {
			m := receive(t, ch)
			got[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
		}
		return got
	}

	first := byID(2) // held, neither acked nor nacked
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, first)
	proxy.cut()
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, byID(2),
		"the lost deliveries resumed, not charged")
	proxy.cut()
	again := map[string]string{}
	for range 2 {
		m := receive(t, ch)
		again[m.UUID] = m.Metadata.Get(framework.MetadataRedelivered)
		if m.UUID == "b" {
			m.Nack()
		} else {
			m.Ack()
		}
	}
	require.Equal(t, map[string]string{"a": "false", "b": "false"}, again, "lost again, resumed again")
	m := receive(t, ch)
	require.Equal(t, "b", m.UUID)
	require.Equal(t, "true", m.Metadata.Get(framework.MetadataRedelivered), "nacked: a redelivery")
	m.Ack()
}

// cutProxy forwards TCP connections to upstream until cut closes them
// all, as a network that drops them does; new ones go through.
type cutProxy struct {
	ln       net.Listener
	upstream string
	mu       sync.Mutex
	conns    []net.Conn
}

func newCutProxy(t *testing.T, upstream string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &cutProxy{ln: ln, upstream: upstream}
	t.Cleanup(func() {
		_ = ln.Close()
		p.cut()
	})
	go p.accept()
	return p
}

func (p *cutProxy) addr() string { return p.ln.Addr().String() }

func (p *cutProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.upstream)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(up, c); _ = up.Close() }()
		go func() { _, _ = io.Copy(c, up); _ = c.Close() }()
	}
}

// cut closes every connection made so far.
func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}
