package testenv

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// Proxy forwards TCP connections to a server on loopback, for the tests
// of a network that fails under a running service: Hole makes it a black
// hole, Drop makes it lose what it carries, Cut drops its connections. It
// closes when the test ends.
type Proxy struct {
	ln       net.Listener
	upstream string
	hole     atomic.Bool
	drop     atomic.Bool
	mu       sync.Mutex
	conns    []net.Conn
}

// NewProxy starts a proxy to upstream (host:port) on a port of its own of
// 127.0.0.1.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &Proxy{ln: ln, upstream: upstream}
	t.Cleanup(func() {
		p.Hole(false)
		_ = ln.Close()
		p.Cut()
	})
	go p.accept()
	return p
}

// Addr is the proxy's host:port, to dial instead of upstream's.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Hole makes the proxy a black hole (on) or mends it (off). A black hole
// keeps every connection open, accepts new ones, and forwards no byte
// either way, as a network path that drops every packet does; once it is
// mended, what was sent meanwhile goes on, as TCP retransmits it.
func (p *Proxy) Hole(on bool) { p.hole.Store(on) }

// Drop makes the proxy lose what it carries, both ways (on), or forward
// again (off). It keeps every connection open: a request or an answer
// lost meanwhile never arrives, as behind a proxy or middlebox that
// dropped it, and its connection waits for nothing once forwarding again.
func (p *Proxy) Drop(on bool) { p.drop.Store(on) }

// Cut closes every connection made so far, as a network that drops them
// does (each side sees its connection end); new ones go through.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

func (p *Proxy) accept() {
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
		go p.pipe(c, up)
		go p.pipe(up, c)
	}
}

// pipe copies src to dst, reading nothing while the proxy is a black
// hole.
func (p *Proxy) pipe(src, dst net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		for p.hole.Load() {
			time.Sleep(10 * time.Millisecond)
		}
		n, err := src.Read(buf)
		if n > 0 && p.drop.Load() {
			n = 0 // lost
		}
		if n > 0 {
			for p.hole.Load() { // read as the hole opened: held, not lost
				time.Sleep(10 * time.Millisecond)
			}
			if _, werr := dst.Write(buf[:n]); werr != nil {
				_ = src.Close()
				return
			}
		}
		if err != nil {
			_ = dst.Close()
			return
		}
	}
}
