package amqp

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	amqp091 "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
	"github.com/effectively-once/effectively/internal/testenv/testserver"
)

// TestParseURLs: EFFECTIVELY_AMQP_URL's list of brokers. Each URL is
// checked, an error names its position and never its text (which may
// hold a password), and the nodes of one cluster may differ only by host
// and port.
func TestParseURLs(t *testing.T) {
	t.Parallel()
	const pw = "s3cret-pw"
	one := "amqp://app:" + pw + "@rabbit-1:5672/vh"
	two := "amqp://app:" + pw + "@rabbit-2:5673/vh"

	urls, err := ParseURLs(one)
	require.NoError(t, err)
	require.Equal(t, []string{one}, urls)
	urls, err = ParseURLs(one + ", " + two + " ,amqp://app:" + pw + "@10.0.0.3/vh")
	require.NoError(t, err)
	require.Equal(t, []string{one, two, "amqp://app:" + pw + "@10.0.0.3/vh"}, urls)

	_, err = ParseURLs(" ")
	require.ErrorIs(t, err, ErrMissingURL)
	for name, tc := range map[string]struct{ urls, want string }{
		"Empty":         {one + ",," + two, "URL 2 of 3: empty"},
		"TrailingComma": {one + "," + two + ",", "URL 3 of 3: empty"},
		"Scheme":        {one + ",http://app:" + pw + "@rabbit-2/vh", "URL 2 of 2: must start with amqp:// or amqps://"},
		"Port":          {one + ",amqp://app:" + pw + "@rabbit-2:x/vh", "URL 2 of 2: not a valid AMQP URL"},
		// A comma inside a password splits the URL: its tail is refused
		// without being shown.
		"CommaInPassword": {"amqp://app:pa,ss@rabbit-1/vh", "URL 1 of 2: not a valid AMQP URL"},
		"OtherPassword":   {one + ",amqp://app:other-" + pw + "@rabbit-2/vh", "URL 2 of 2: only the host and port may differ"},
		"OtherUser":       {one + ",amqp://ops:" + pw + "@rabbit-2/vh", "URL 2 of 2: only the host and port may differ"},
		"OtherVhost":      {one + "," + strings.TrimSuffix(two, "/vh") + "/", "URL 2 of 2: only the host and port may differ"},
		"OtherScheme":     {one + ",amqps://app:" + pw + "@rabbit-2/vh", "URL 2 of 2: only the host and port may differ"},
		"OtherParameters": {one + "," + two + "?heartbeat=5", "URL 2 of 2: only the host and port may differ"},
		"Single":          {"amqp//rabbit", "URL: must start with amqp://"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ParseURLs(tc.urls)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), pw)
			require.NotContains(t, err.Error(), "ss@")
			require.NotContains(t, err.Error(), ":pa")
			_, err = New(TransportConfig{URL: tc.urls})
			require.ErrorContains(t, err, tc.want, "New checks the list")
		})
	}
}

// TestBrokersDialInTurn: each dial goes to the first node that answers,
// from the one after the node last dialed: a connection lost to node 1
// goes to node 2 without waiting for node 1 again, and back to node 1
// when node 2 is gone.
func TestBrokersDialInTurn(t *testing.T) {
	t.Parallel()
	ln1, addr1 := listen(t)
	ln2, addr2 := listen(t)
	b := dialer(t, "amqp://u:p@"+addr1+"/", "amqp://u:p@"+addr2+"/")
	require.Empty(t, b.current())

	dialed := func(ln net.Listener) {
		t.Helper()
		conn, err := b.dial("tcp", "ignored:5672")
		require.NoError(t, err)
		defer conn.Close()
		require.NoError(t, ln.(*net.TCPListener).SetDeadline(time.Now().Add(10*time.Second)))
		accepted, err := ln.Accept()
		require.NoError(t, err)
		require.Equal(t, conn.LocalAddr().String(), accepted.RemoteAddr().String())
		_ = accepted.Close()
	}
	dialed(ln1)
	require.Equal(t, "amqp://u:xxxxx@"+addr1+"/", b.current())
	dialed(ln2) // the next dial, a reconnection, starts after node 1
	require.Equal(t, "amqp://u:xxxxx@"+addr2+"/", b.current())
	require.NoError(t, ln2.Close())
	dialed(ln1) // starts after node 2; node 1 answers

	// Every node down. A closed listener's port is free for any other
	// test's listener to take (a fresh clone's run saw the dial succeed),
	// so the nodes down are ports held by sockets that never listen.
	down1, down2 := refusing(t), refusing(t)
	b = dialer(t, "amqp://u:p@"+down1+"/", "amqp://u:p@"+down2+"/")
	_, err := b.dial("tcp", "ignored:5672")
	require.ErrorContains(t, err, "amqp://u:xxxxx@"+down1+"/", "every node's error, without the password")
	require.ErrorContains(t, err, "amqp://u:xxxxx@"+down2+"/")
	require.NotContains(t, err.Error(), ":p@")
}

// TestBrokersClose: close closes the connections dialed that are still
// open, and refuses dials after it. watermill-amqp may reconnect while
// its connection closes and never close what it dialed; before close
// did, such a connection stayed open to the broker (and its writer
// goroutine ran) for the life of the process.
func TestBrokersClose(t *testing.T) {
	t.Parallel()
	ln, addr := listen(t)
	b := dialer(t, "amqp://u:p@"+addr+"/")
	conn, err := b.dialCoalesced("tcp", "ignored:5672")
	require.NoError(t, err)
	require.NoError(t, ln.(*net.TCPListener).SetDeadline(time.Now().Add(10*time.Second)))
	accepted, err := ln.Accept()
	require.NoError(t, err)
	defer accepted.Close()
	closed, err := b.dialCoalesced("tcp", "ignored:5672")
	require.NoError(t, err)
	require.NoError(t, closed.Close(), "a connection its user closed")

	require.NoError(t, b.close())
	require.NoError(t, accepted.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err = accepted.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the broker's end sees the connection closed")
	_, err = conn.Write([]byte("x"))
	require.ErrorIs(t, err, net.ErrClosed)
	_, err = b.dialCoalesced("tcp", "ignored:5672")
	require.ErrorIs(t, err, ErrClosed)
}

// refusing returns a loopback address that refuses connections for the
// rest of the test: a socket bound to it, which never listens, holds its
// port, so that no listener of this process or another takes it.
func refusing(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Close(fd) })
	require.NoError(t, syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}))
	sa, err := syscall.Getsockname(fd)
	require.NoError(t, err)
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// TestBrokersDialTLS: an amqps:// node's TLS handshake is the dialer's,
// checked against the name of the node it reached (not the first URL's
// host) with the URL's cacertfile.
func TestBrokersDialTLS(t *testing.T) {
	t.Parallel()
	cert, caFile := selfSigned(t, "localhost")
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	_, port, err := net.SplitHostPort(ln.Addr().String())
	require.NoError(t, err)
	closedAddr := refusing(t)

	// Node 1 is down; node 2's certificate names localhost, not
	// 127.0.0.1, the first URL's host.
	query := "?cacertfile=" + caFile
	b := dialer(t, "amqps://u:p@"+closedAddr+"/"+query, "amqps://u:p@localhost:"+port+"/"+query)
	require.True(t, strings.HasPrefix(b.dialURI(), "amqp://"), "amqp091-go does not wrap TLS again")
	served := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			err = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
		served <- err
	}()
	conn, err := b.dial("tcp", "ignored:5671")
	require.NoError(t, err)
	defer conn.Close()
	tc, ok := conn.(*tls.Conn)
	require.True(t, ok, "a TLS connection")
	require.Equal(t, "localhost", tc.ConnectionState().ServerName)
	require.NoError(t, <-served)

	// Another name than the certificate's fails the handshake.
	b = dialer(t, "amqps://u:p@127.0.0.1:"+port+"/"+query)
	go func() {
		c, err := ln.Accept()
		if err == nil {
			_ = c.(*tls.Conn).Handshake()
			_ = c.Close()
		}
	}()
	_, err = b.dial("tcp", "ignored:5671")
	require.ErrorContains(t, err, "TLS handshake")
}

// TestFailover: a transport given two brokers consumes on the second once
// the first, where it was connected, stops. The second is the tests'
// shared node, independent of the first (a node of the test's own): the
// consumer's queue is declared on it too, as a cluster would hold it.
// Publishing through the transport goes to the second node as well.
//
// watermill-amqp races on a lost connection (see TestBrokerRestart): under
// -race this test runs itself again in a child `go test` without it.
func TestFailover(t *testing.T) {
	t.Parallel()
	if testserver.RaceEnabled {
		testenv.Require(t, testenv.AMQPURLVar)
		testserver.RerunWithoutRace(t, "TestFailover")
		return
	}
	shared := testenv.Require(t, testenv.AMQPURLVar)
	first := testserver.StartRabbitMQ(t)
	topic, consumer := "failover.t"+randomSuffix(), "failover-"+randomSuffix()
	t.Cleanup(func() { deleteTopology(t, shared, consumer, topic) })
	sc := driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 2}

	// The queue on the second node, and a publisher there: a service
	// that publishes to the cluster through another node.
	elsewhere := newTransport(t, TransportConfig{URL: shared})
	declared, err := elsewhere.Subscribe(sc)
	require.NoError(t, err)
	require.NoError(t, declared.Initialize())

	var logs syncWriter
	tr := newTransport(t, TransportConfig{
		URL:    first.URL + "," + shared,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
	})
	require.Equal(t, redact(first.URL), tr.conn.brokers.current(), "connected to the first that answers")
	sub, err := tr.Subscribe(sc)
	require.NoError(t, err)
	require.NoError(t, sub.Initialize())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscriber.Subscribe(ctx, topic)
	require.NoError(t, err)

	consume := func(ids ...string) {
		t.Helper()
		got := make([]string, 0, len(ids))
		for range ids {
			msg := receive(t, ch)
			got = append(got, msg.UUID)
			msg.Ack()
		}
		require.ElementsMatch(t, ids, got)
	}
	require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage("before-1", []byte(`{}`)), message.NewMessage("before-2", []byte(`{}`))))
	consume("before-1", "before-2")

	first.Stop(t)
	require.Eventually(t, func() bool { return tr.Ready() && tr.conn.brokers.current() == redact(shared) },
		60*time.Second, 50*time.Millisecond, "reconnected to the second broker")

	require.NoError(t, elsewhere.Publisher().Publish(topic, message.NewMessage("after-1", []byte(`{}`)), message.NewMessage("after-2", []byte(`{}`))))
	consume("after-1", "after-2")
	require.NoError(t, tr.Publisher().Publish(topic, message.NewMessage("after-3", []byte(`{}`))),
		"the transport publishes to the second broker")
	consume("after-3")
	require.Contains(t, logs.String(), "connecting to another broker node")
	require.NotContains(t, logs.String(), "guest:guest@", "no password in the logs")
}

// listen returns a TCP listener on a free loopback port, closed when the
// test ends, and its address.
func listen(t *testing.T) (net.Listener, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	return ln, ln.Addr().String()
}

// dialer returns the brokers of urls.
func dialer(t *testing.T, urls ...string) *brokers {
	t.Helper()
	parsed, err := ParseURLs(strings.Join(urls, ","))
	require.NoError(t, err)
	b, err := newBrokers(parsed, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return b
}

// selfSigned returns a certificate for host and the file of its PEM, to
// trust as a CA.
func selfSigned(t *testing.T, host string) (tls.Certificate, string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		DNSNames:              []string{host},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	file := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(file, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600))
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, file
}

// deleteTopology deletes queue and exchange from the broker at url.
func deleteTopology(t *testing.T, url, queue, exchange string) {
	t.Helper()
	conn, err := amqp091.Dial(url)
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Logf("delete %s: %v", queue, err)
		return
	}
	_, qerr := ch.QueueDelete(queue, false, false, false)
	eerr := ch.ExchangeDelete(exchange, false, false)
	if err := errors.Join(qerr, eerr); err != nil {
		t.Logf("delete %s: %v", queue, err)
	}
}

// syncWriter is a strings.Builder that a logger may write from several
// goroutines.
type syncWriter struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestQueueType: QueueType quorum declares each consumer's queue durable
// with x-queue-type quorum and x-delivery-limit DeliveryLimit, which
// RabbitMQ then holds it to: the same arguments declare it again, other
// ones fail with PRECONDITION_FAILED. The default is a classic queue,
// declared without arguments, as queues were before QueueType.
func TestQueueType(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	quorum := func(limit int32) amqp091.Table {
		return amqp091.Table{"x-queue-type": "quorum", "x-delivery-limit": limit}
	}
	for name, tc := range map[string]struct {
		cfg   TransportConfig
		same  amqp091.Table
		other []amqp091.Table
	}{
		"Quorum": {
			cfg:   TransportConfig{QueueType: QueueQuorum, DeliveryLimit: 7},
			same:  quorum(7),
			other: []amqp091.Table{quorum(8), {"x-queue-type": "quorum"}, nil},
		},
		"QuorumDefaultLimit": {
			cfg:   TransportConfig{QueueType: QueueQuorum},
			same:  quorum(DefaultDeliveryLimit),
			other: []amqp091.Table{quorum(20), {"x-queue-type": "quorum"}},
		},
		"ClassicByDefault": {
			same:  nil,
			other: []amqp091.Table{quorum(DefaultDeliveryLimit), {"x-queue-type": "quorum"}},
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			topic, consumer := "qtype.t"+randomSuffix(), "qtype-"+randomSuffix()
			t.Cleanup(func() { deleteTopology(t, url, consumer, topic) })
			tc.cfg.URL = url
			tr := newTransport(t, tc.cfg)
			sub, err := tr.Subscribe(driver.SubscribeConfig{Consumer: consumer, Types: []string{topic}, Concurrency: 1})
			require.NoError(t, err)
			require.NoError(t, sub.Initialize())

			require.NoError(t, declareQueue(t, url, consumer, tc.same), "declared with these arguments")
			for _, args := range tc.other {
				err := declareQueue(t, url, consumer, args)
				var amqpErr *amqp091.Error
				require.ErrorAs(t, err, &amqpErr, "arguments %v", args)
				require.Equal(t, amqp091.PreconditionFailed, amqpErr.Code, "arguments %v: %v", args, err)
			}
		})
	}
}

// declareQueue declares the durable queue with args on a channel of its
// own, which RabbitMQ closes when it refuses them.
func declareQueue(t *testing.T, url, queue string, args amqp091.Table) error {
	t.Helper()
	conn, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer conn.Close()
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare(queue, true, false, false, false, args)
	return err
}

// TestResubscribeBacksOff: while the consumer's queue cannot be consumed,
// as a classic queue whose node is down (here another connection holds a
// queue of its name exclusively), the subscription tries again after a
// pause that doubles (100 ms, 200 ms, ... up to MaxConnectInterval), not
// every 100 ms; once the queue is free it consumes again.
func TestResubscribeBacksOff(t *testing.T) {
	t.Parallel()
	url := testenv.Require(t, testenv.AMQPURLVar)
	attempts := &attemptLog{}
	conn := connect(t, TransportConfig{URL: url, Logger: slog.New(attempts), MaxConnectInterval: 5 * time.Second})
	topic, consumer := "backoff.t"+randomSuffix(), "backoff-"+randomSuffix()
	t.Cleanup(func() { deleteTopology(t, url, consumer, topic) })
	sub, err := subscriberOf(conn, consumer, 1)
	require.NoError(t, err)
	defer sub.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	// Delete the queue, which cancels the subscription's consumer, and
	// declare one of its name exclusively, again when the subscription
	// declared it first.
	other, err := amqp091.Dial(url)
	require.NoError(t, err)
	defer other.Close()
	for try := 0; ; try++ {
		require.Less(t, try, 50, "the queue taken away")
		och, err := other.Channel()
		require.NoError(t, err)
		if _, err := och.QueueDelete(consumer, false, false, false); err != nil {
			continue
		}
		if _, err := och.QueueDeclare(consumer, false, false, true, false, nil); err == nil {
			break
		}
	}
	const tries = 6
	require.Eventually(t, func() bool { return len(attempts.times()) >= tries }, 30*time.Second, 10*time.Millisecond)
	times := attempts.times()
	for i := 1; i < tries; i++ {
		want := resubscribePause << (i - 1)
		require.GreaterOrEqual(t, times[i].Sub(times[i-1]), want, "pause before attempt %d", i+1)
	}

	require.NoError(t, other.Close()) // the exclusive queue goes with it
	pub, err := newPublisher(conn)
	require.NoError(t, err)
	defer pub.Close()
	require.Eventually(t, func() bool {
		_ = pub.Publish(topic, message.NewMessage("back", []byte(`{}`))) // routed once the queue is bound again
		select {
		case msg := <-ch:
			msg.Ack()
			return msg.UUID == "back"
		case <-time.After(100 * time.Millisecond):
			return false
		}
	}, 30*time.Second, 10*time.Millisecond, "consumes again")
}

// attemptLog is a slog handler that records when the subscriptions failed
// to consume.
type attemptLog struct {
	mu sync.Mutex
	at []time.Time
}

func (l *attemptLog) Enabled(context.Context, slog.Level) bool { return true }

func (l *attemptLog) Handle(_ context.Context, r slog.Record) error {
	if r.Message == "amqp: consume" {
		l.mu.Lock()
		l.at = append(l.at, r.Time)
		l.mu.Unlock()
	}
	return nil
}

func (l *attemptLog) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *attemptLog) WithGroup(string) slog.Handler      { return l }

func (l *attemptLog) times() []time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.at)
}
