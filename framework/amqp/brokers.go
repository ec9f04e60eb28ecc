package amqp

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	amqp091 "github.com/rabbitmq/amqp091-go"
)

// defaultConnectionTimeout bounds dialing a broker and its TCP, TLS and
// AMQP handshakes, when the URL sets no connection_timeout. amqp091-go's
// own is 30 s: a reconnection started during a network black hole (the
// TCP connection accepted, no byte answered) would then wait that long
// after the path comes back before the next try. A handshake takes
// milliseconds on a working path.
const defaultConnectionTimeout = 5 * time.Second

// ParseURLs splits s, one broker URL or the URLs of several nodes of one
// cluster separated by commas, and checks each. The nodes of one cluster
// share their users and virtual hosts, so the URLs may differ only by host
// and port: same scheme, user, password, virtual host and parameters. An
// error names the URL by its position, never by its text, which may hold
// a password (a comma inside a password is written %2C).
func ParseURLs(s string) ([]string, error) {
	if strings.TrimSpace(s) == "" {
		return nil, ErrMissingURL
	}
	parts := strings.Split(s, ",")
	urls := make([]string, 0, len(parts))
	var first *url.URL
	for i, p := range parts {
		p = strings.TrimSpace(p)
		u, err := parseURL(p)
		if err != nil {
			if len(parts) == 1 {
				return nil, fmt.Errorf("amqp: URL: %w", err)
			}
			return nil, fmt.Errorf("amqp: URL %d of %d: %w", i+1, len(parts), err)
		}
		if first == nil {
			first = u
		} else if !sameButAddress(first, u) {
			return nil, fmt.Errorf("amqp: URL %d of %d: only the host and port may differ from URL 1 (the nodes of one cluster share the scheme, user, password, virtual host and parameters)", i+1, len(parts))
		}
		urls = append(urls, p)
	}
	return urls, nil
}

// parseURL checks one broker URL. Its errors do not quote it.
func parseURL(s string) (*url.URL, error) {
	if s == "" {
		return nil, errors.New("empty (e.g. amqp://guest:guest@127.0.0.1:5672/)")
	}
	if !strings.HasPrefix(s, "amqp://") && !strings.HasPrefix(s, "amqps://") {
		return nil, errors.New("must start with amqp:// or amqps://")
	}
	// The parsers' errors quote parts of the URL, the password's too.
	const invalid = "not a valid AMQP URL: check its form, amqp://USER:PASSWORD@HOST:PORT/VHOST, its port (a number) and " +
		"a host in brackets if IPv6; a comma or another reserved character of a password is written percent-encoded, e.g. %2C"
	if _, err := amqp091.ParseURI(s); err != nil {
		return nil, errors.New(invalid)
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, errors.New(invalid)
	}
	return u, nil
}

// sameButAddress reports whether a and b differ at most by host and port.
func sameButAddress(a, b *url.URL) bool {
	return a.Scheme == b.Scheme && a.User.String() == b.User.String() &&
		a.Path == b.Path && a.RawQuery == b.RawQuery
}

// node is one node of a TransportConfig's URL.
type node struct {
	url     string // as configured
	addr    string // host:port
	tls     bool   // amqps
	timeout time.Duration
	uri     amqp091.URI
}

// brokers dials the nodes of a TransportConfig's URL for watermill-amqp's
// connection, which dials one address and redials it when the connection
// is lost: its dial function picks the node instead. Each dial tries the
// nodes in turn, from the one after the node last dialed, and returns the
// first that answers, so that a lost connection goes to the next node
// that answers.
type brokers struct {
	nodes  []node
	logger *slog.Logger
	// heartbeat is TransportConfig.Heartbeat, which the URL's own
	// heartbeat overrides (amqp091-go).
	heartbeat time.Duration

	mu     sync.Mutex
	next   int // the node the next dial tries first
	last   int // the node last dialed, -1 before the first
	open   map[*coalescingConn]struct{}
	closed bool // close was called: no more dials
}

// newBrokers returns the nodes of urls, a list ParseURLs accepted.
func newBrokers(urls []string, logger *slog.Logger) (*brokers, error) {
	b := &brokers{logger: logger, last: -1, open: map[*coalescingConn]struct{}{}}
	for _, u := range urls {
		uri, err := amqp091.ParseURI(u)
		if err != nil {
			return nil, fmt.Errorf("amqp: URL %s: %w", redact(u), err)
		}
		timeout := defaultConnectionTimeout
		if uri.ConnectionTimeout > 0 {
			timeout = time.Duration(uri.ConnectionTimeout) * time.Millisecond
		}
		b.nodes = append(b.nodes, node{
			url:     u,
			addr:    net.JoinHostPort(uri.Host, strconv.Itoa(uri.Port)),
			tls:     uri.Scheme == "amqps",
			timeout: timeout,
			uri:     uri,
		})
	}
	return b, nil
}

// dialURI is the URL watermill-amqp's connection is given: the first
// node's, over amqp://, for its user, password, virtual host and
// parameters (every node shares them); dial decides where it connects,
// and does the TLS handshake of amqps:// nodes itself, with the name of
// the node it reached.
func (b *brokers) dialURI() string {
	u := b.nodes[0].url
	if b.nodes[0].tls {
		u = "amqp://" + strings.TrimPrefix(u, "amqps://")
	}
	return u
}

// config is the amqp091-go configuration of watermill-amqp's connection:
// it dials with dial, coalesces the connection's writes (see
// coalescingConn), and proposes the heartbeat (the broker's own, when
// lower, wins).
func (b *brokers) config() *amqp091.Config {
	return &amqp091.Config{Heartbeat: b.heartbeat, Dial: b.dialCoalesced}
}

// dialCoalesced dials as dial does, and returns the connection with its
// writes coalesced, counted among the open ones until close; ErrClosed
// after close.
func (b *brokers) dialCoalesced(network, addr string) (net.Conn, error) {
	b.mu.Lock()
	closed := b.closed
	b.mu.Unlock()
	if closed {
		return nil, ErrClosed
	}
	conn, err := b.dial(network, addr)
	if err != nil {
		return nil, err
	}
	c := newCoalescingConn(conn)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		_ = c.Close()
		return nil, ErrClosed
	}
	for o := range b.open {
		select {
		case <-o.done: // closed, or its socket failed
			delete(b.open, o)
		default:
		}
	}
	b.open[c] = struct{}{}
	return c, nil
}

// close refuses further dials and closes the connections dialed that are
// still open. watermill-amqp may reconnect while its connection closes:
// that connection, which it never closes, is closed here.
func (b *brokers) close() error {
	b.mu.Lock()
	b.closed = true
	open := b.open
	b.open = nil
	b.mu.Unlock()
	var errs []error
	for c := range open {
		if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// current returns the URL of the node last dialed, password hidden, or ""
// before the first dial.
func (b *brokers) current() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.last < 0 {
		return ""
	}
	return redact(b.nodes[b.last].url)
}

// dial connects to the first node that answers, trying each once from the
// one after the node last dialed. amqp091-go calls it with the first
// node's address, which it ignores.
func (b *brokers) dial(network, _ string) (net.Conn, error) {
	b.mu.Lock()
	start := b.next
	b.mu.Unlock()
	var errs []error
	for i := range b.nodes {
		k := (start + i) % len(b.nodes)
		n := b.nodes[k]
		conn, err := n.dial(network)
		if err != nil {
			if len(b.nodes) > 1 {
				b.logger.Warn("amqp: broker node unreachable, trying the next", "node", redact(n.url), "error", err)
			}
			errs = append(errs, fmt.Errorf("%s: %w", redact(n.url), err))
			continue
		}
		b.mu.Lock()
		failover := b.last >= 0 && b.last != k
		b.last, b.next = k, (k+1)%len(b.nodes)
		b.mu.Unlock()
		if failover {
			b.logger.Warn("amqp: connecting to another broker node", "node", redact(n.url))
		}
		return conn, nil
	}
	return nil, errors.Join(errs...)
}

// dial connects to the node, with a deadline on the handshakes that
// amqp091-go clears once the connection is open, as its own dialer does.
func (n node) dial(network string) (net.Conn, error) {
	conn, err := net.DialTimeout(network, n.addr, n.timeout)
	if err != nil {
		return nil, err
	}
	if err := conn.SetDeadline(time.Now().Add(n.timeout)); err != nil {
		_ = conn.Close()
		return nil, err
	}
	if !n.tls {
		return conn, nil
	}
	cfg, err := tlsConfig(n.uri)
	if err != nil {
		_ = conn.Close()
		return nil, err
	}
	tc := tls.Client(conn, cfg)
	if err := tc.Handshake(); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("TLS handshake: %w", err)
	}
	return tc, nil
}

// tlsConfig is the TLS configuration of an amqps:// node, from its URL's
// parameters as amqp091-go reads them: cacertfile (else the system's
// roots), certfile and keyfile (a client certificate),
// server_name_indication (else the node's host).
func tlsConfig(uri amqp091.URI) (*tls.Config, error) {
	cfg := &tls.Config{ServerName: uri.ServerName, MinVersion: tls.VersionTLS12}
	if cfg.ServerName == "" {
		cfg.ServerName = uri.Host
	}
	if uri.CACertFile != "" {
		pem, err := os.ReadFile(uri.CACertFile)
		if err != nil {
			return nil, fmt.Errorf("read CA certificate: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", uri.CACertFile)
		}
	}
	if uri.CertFile != "" && uri.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(uri.CertFile, uri.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
