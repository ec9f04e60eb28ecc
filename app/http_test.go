package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/handlers"
)

// holdOnce is an Outer step that nacks the first delivery of each event,
// and holds its second delivery until the test releases it with the
// error the delivery is to end with (nil: it goes on to the handler).
type holdOnce struct {
	mu        sync.Mutex
	delivered map[string]int
	held      chan string // the id of each held delivery
	release   map[string]chan error
}

func newHoldOnce(ids ...string) *holdOnce {
	h := &holdOnce{delivered: make(map[string]int), held: make(chan string, len(ids)), release: make(map[string]chan error)}
	for _, id := range ids {
		h.release[id] = make(chan error, 1)
	}
	return h
}

func (h *holdOnce) middleware(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		d, _ := framework.EnvelopeFromContext(msg.Context())
		h.mu.Lock()
		h.delivered[d.ID]++
		n := h.delivered[d.ID]
		h.mu.Unlock()
		switch n {
		case 1:
			return nil, errors.New("not yet")
		case 2:
			h.held <- d.ID
			select {
			case err := <-h.release[d.ID]:
				if err != nil {
					return nil, err
				}
			case <-msg.Context().Done():
				return nil, msg.Context().Err()
			}
		}
		return next(msg)
	}
}

// TestReadyzFailingMessages: while a message keeps failing, /readyz (still
// 200) and /metrics show its consumer with one failing message; once the
// message took effect, or was dead-lettered, neither shows it.
func TestReadyzFailingMessages(t *testing.T) {
	t.Parallel()
	hold := newHoldOnce("w-1", "w-2")
	b := setup(t, testConfig(t), fx.Supply(app.Middleware{Outer: []message.HandlerMiddleware{hold.middleware}}))
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: waitLimit}
	get := func(path string) (int, []byte) {
		t.Helper()
		resp, err := client.Get("http://" + b.http.Addr() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, body
	}
	readyz := func() app.ReadyzConsumer {
		t.Helper()
		// A failing message leaves the service ready: 200, once the
		// database answers within /readyz's budget, which a loaded
		// machine can miss for a moment.
		var body []byte
		waitFor(t, "/readyz 200 (a failing message leaves the service ready)", func() bool {
			var code int
			code, body = get("/readyz")
			return code == http.StatusOK
		})
		var got app.ReadyzBody
		require.NoError(t, json.Unmarshal(body, &got))
		require.Equal(t, "ready", got.Status)
		require.Len(t, got.Consumers, 1)
		require.Equal(t, consumerName, got.Consumers[0].Consumer)
		require.InDelta(t, 10*3*31, got.Consumers[0].HoldUpLimitSeconds, 0, "the defaults: max_deliveries × attempts × (timeout + retry_delay)")
		return got.Consumers[0]
	}
	gauge := func(name string) float64 {
		t.Helper()
		_, body := get("/metrics")
		m := regexp.MustCompile(`(?m)^` + name + `\{consumer="` + regexp.QuoteMeta(consumerName) + `"\} (\S+)$`).FindSubmatch(body)
		require.NotNil(t, m, "%s of the consumer in /metrics", name)
		v, err := strconv.ParseFloat(string(m[1]), 64)
		require.NoError(t, err)
		return v
	}
	requireNoneFailing := func(what string) {
		t.Helper()
		waitFor(t, what, func() bool { return readyz().FailingMessages == 0 })
		require.Equal(t, app.ReadyzConsumer{Consumer: consumerName, HoldUpLimitSeconds: 10 * 3 * 31}, readyz())
		require.Zero(t, gauge("effectively_consumer_failing_messages"))
		require.Zero(t, gauge("effectively_consumer_oldest_failing_seconds"))
	}
	requireOneFailing := func(id string) {
		t.Helper()
		select {
		case held := <-hold.held: // nacked once, delivered again, held
			require.Equal(t, id, held)
		case <-time.After(waitLimit):
			t.Fatalf("no second delivery of %s", id)
		}
		c := readyz()
		require.Equal(t, 1, c.FailingMessages)
		require.Positive(t, c.OldestFailingSeconds)
		require.False(t, c.HeldUp)
		require.InDelta(t, 1, gauge("effectively_consumer_failing_messages"), 0)
		require.Positive(t, gauge("effectively_consumer_oldest_failing_seconds"))
		require.InDelta(t, 10*3*31, gauge("effectively_consumer_hold_up_limit_seconds"), 0)
	}

	requireNoneFailing("no failing message at start")
	b.publish(t, "w-1", "sprocket")
	requireOneFailing("w-1")
	hold.release["w-1"] <- nil
	waitFor(t, "the widget", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 1 })
	requireNoneFailing("the message that took effect cleared")

	b.publish(t, "w-2", "gear")
	requireOneFailing("w-2")
	hold.release["w-2"] <- framework.Permanent("gear_refused", nil)
	waitFor(t, "the dead letter", func() bool { return b.count(t, `SELECT count(*) FROM dead_letters`) == 1 })
	requireNoneFailing("the dead-lettered message cleared")
}

// TestHTTPAddrInUseStartsNoConsumer starts the service on an HTTP address
// that another process holds: the start fails naming the setting, and no
// consumer subscribed. The router started first, and so its consumers
// registered their groups and took messages, which a start that then
// failed on the address left half done.
func TestHTTPAddrInUseStartsNoConsumer(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer taken.Close()
	cfg := testConfig(t)
	cfg.HTTPAddr = taken.Addr().String()
	var handled atomic.Int32
	service := app.New(
		handlers.Register(consumerName, handlers.On(widgetAdded, func(context.Context, framework.Event[widgetAddedV1]) error {
			handled.Add(1)
			return nil
		})),
		fx.Supply(widgetMigrations),
		fx.Replace(cfg),
	)
	require.NoError(t, service.Err())
	ctx, cancel := context.WithTimeout(context.Background(), waitLimit)
	defer cancel()
	err = service.Start(ctx)
	require.ErrorContains(t, err, "http_addr (EFFECTIVELY_HTTP_ADDR)")
	require.ErrorContains(t, err, "address already in use")
	require.NoError(t, service.Stop(ctx))

	db, err := sqlite.Open(ctx, cfg.DatabaseURL, sqlite.OpenConfig{})
	require.NoError(t, err)
	defer db.Close()
	var groups int
	require.NoError(t, db.Get(&groups, `SELECT count(*) FROM sqlite_master WHERE name = ?`, sqlite.PubSubGroupsTable))
	if groups > 0 {
		require.NoError(t, db.Get(&groups, `SELECT count(*) FROM `+sqlite.PubSubGroupsTable+` WHERE consumer_group = ?`, consumerName))
	}
	require.Zero(t, groups, "a consumer subscribed before the HTTP address was refused")
	require.Zero(t, handled.Load())
}

// TestServiceMetrics: a service registers a collector of its own on the
// prometheus.Registerer the application provides, and /metrics serves it
// beside the framework's metrics; the prometheus.Gatherer the application
// provides gathers it too.
func TestServiceMetrics(t *testing.T) {
	t.Parallel()
	widgets := prometheus.NewCounter(prometheus.CounterOpts{Name: "widgets_seen_total", Help: "Widgets the handler saw."})
	var gatherer prometheus.Gatherer
	b := setupWith(t, testConfig(t), handlers.On(widgetAdded, func(db *sqlx.DB) framework.HandlerFunc[widgetAddedV1] {
		add := newAddWidget(db)
		return func(ctx context.Context, ev framework.Event[widgetAddedV1]) error {
			widgets.Inc()
			return add(ctx, ev)
		}
	}),
		fx.Invoke(func(reg prometheus.Registerer) error { return reg.Register(widgets) }),
		fx.Populate(&gatherer),
	)
	b.publish(t, "w-1", "sprocket")
	waitFor(t, "the widget", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 1 })

	// The outcome is counted after the handler's transaction commits, so
	// the widget can be seen a moment before the counter moves.
	processed := regexp.MustCompile(`(?m)^effectively_messages_total\{consumer="` + regexp.QuoteMeta(consumerName) + `",outcome="processed"\} 1$`)
	var body string
	waitFor(t, "the processed outcome counted, on the same registry as the service's own counter", func() bool {
		body = metrics(t, b)
		return processed.MatchString(body)
	})
	require.Regexp(t, `(?m)^widgets_seen_total 1$`, body, "the service's own counter")

	mfs, err := gatherer.Gather()
	require.NoError(t, err)
	var names []string
	for _, mf := range mfs {
		names = append(names, mf.GetName())
	}
	require.Contains(t, names, "widgets_seen_total")
}
