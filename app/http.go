package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// readiness says whether the application consumes: true once the router
// runs, false once it stops.
type readiness struct{ ready atomic.Bool }

func (r *readiness) get() bool  { return r.ready.Load() }
func (r *readiness) set(v bool) { r.ready.Store(v) }

// registry is the application's Prometheus registry, served on /metrics:
// the Go runtime's and the process's collectors, the consumers' metrics
// (*middleware.Metrics, which the application provides too), the outbox
// relay's, and the service's own collectors, which it registers through
// the prometheus.Registerer the application provides.
type registry struct {
	*prometheus.Registry
}

// metricsResult is what newMetrics gives fx: the registry, as the application's
// own wiring and as the prometheus.Registerer and prometheus.Gatherer a
// service takes, and the consumers' metrics registered on it.
type metricsResult struct {
	fx.Out

	Registry   registry
	Registerer prometheus.Registerer
	Gatherer   prometheus.Gatherer
	Consumers  *middleware.Metrics
}

// newMetrics returns a fresh registry (never the global one) and the
// consumers' metrics registered on it.
func newMetrics() (metricsResult, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := middleware.NewMetrics(reg)
	if err != nil {
		return metricsResult{}, fmt.Errorf("metrics: %w", err)
	}
	return metricsResult{Registry: registry{reg}, Registerer: reg, Gatherer: reg, Consumers: m}, nil
}

// httpParams are what newHTTP takes from fx.
type httpParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Registry  registry
	Readiness *readiness
	Transport driver.Transport
	DB        *sqlx.DB
	Consumers *middleware.Metrics
	Logger    *slog.Logger `optional:"true"`
	// Store and Declarations feed the operator console, when it is on.
	Store        driver.Store
	Declarations []handlers.Declaration `group:"effectively.consumers"`
}

// httpServer serves /healthz (the process lives), /readyz (the router
// runs, the transport is connected and the database answers; a JSON body
// with each consumer's failing messages, see docs/operations.md) and
// /metrics on Config.HTTPAddr, open to probes and scrapers, and the
// operator console under /console/ when Config.Console.Enabled, behind
// its tokens.
type httpServer struct {
	addr atomic.Value // string
}

// Addr returns the address the server listens on, once started; empty when
// HTTP is off.
func (h *httpServer) Addr() string {
	a, _ := h.addr.Load().(string)
	return a
}

// newHTTP builds the server; it listens when the application starts.
func newHTTP(p httpParams) (*httpServer, error) {
	h := &httpServer{}
	if p.Config.HTTPAddr == "" {
		return h, nil
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), readyzTimeout)
		defer cancel()
		statuses := p.Consumers.Consumers()
		body := readyzBody{Status: "ready", Consumers: readyzConsumers(statuses, p.Consumers.Breakers())}
		w.Header().Set("Content-Type", "application/json")
		if reason := unready(ctx, p, statuses); reason != "" {
			body.Status, body.Reason = "unavailable", reason
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		_ = json.NewEncoder(w).Encode(body)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.Registry.Registry, promhttp.HandlerOpts{}))
	var cons *console.Console
	if p.Config.Console.Enabled {
		c, err := newConsole(p.Config, p.Store, p.Transport, p.Declarations, p.Logger)
		if err != nil {
			return nil, err
		}
		mux.Handle(console.Path, c)
		cons = c
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", p.Config.HTTPAddr)
			if err != nil {
				return fmt.Errorf("%s: listen on %s: %w", setting("http_addr", EnvHTTPAddr), p.Config.HTTPAddr, err)
			}
			h.addr.Store(ln.Addr().String())
			go func() {
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					orDefault(p.Logger).Error("http server stopped", "error", err)
				}
			}()
			return nil
		},
		OnStop: func(ctx context.Context) error {
			err := srv.Shutdown(ctx)
			if cons != nil {
				// Its bulk jobs stop, to be resumed: they read as
				// interrupted once their heartbeat is stale.
				cons.Close()
			}
			return err
		},
	})
	return h, nil
}

// readyzBody is the JSON body of /readyz. The status code says whether
// the service can work (200) or not (503); a consumer whose messages keep
// failing leaves it ready: the messages are dead-lettered within the
// consumer's hold-up limit, and another process would fail on them too.
// So does an open circuit breaker: its dependency is down for every
// process, and a restart would only lose the breaker's state.
type readyzBody struct {
	// Status is "ready" or "unavailable".
	Status string `json:"status"`
	// Reason says why the service is unavailable: "router not running",
	// "transport not connected", "database unavailable" or "database
	// full".
	Reason string `json:"reason,omitempty"`
	// Consumers are the consumers' failing messages in this process, by
	// name.
	Consumers []readyzConsumer `json:"consumers"`
}

// readyzConsumer is one consumer's entry in /readyz (see
// middleware.ConsumerStatus).
type readyzConsumer struct {
	// Consumer is the consumer's name.
	Consumer string `json:"consumer"`
	// FailingMessages counts its messages whose last attempt or delivery
	// failed, neither acknowledged nor dead-lettered yet.
	FailingMessages int `json:"failing_messages"`
	// OldestFailingSeconds is the time since the first failure of the
	// oldest of them; 0 when none fails.
	OldestFailingSeconds float64 `json:"oldest_failing_seconds"`
	// HoldUpLimitSeconds is the longest a message should keep failing
	// before it is dead-lettered: max_deliveries × attempts × (timeout +
	// retry_delay).
	HoldUpLimitSeconds float64 `json:"hold_up_limit_seconds,omitempty"`
	// HeldUp says the oldest failing message has been failing for longer
	// than the hold-up limit: it is not being dead-lettered.
	HeldUp bool `json:"held_up"`
	// PausedMessages counts its messages whose attempts pause now for
	// an outage of the database, uncharged; Paused says why ("database
	// unreachable" or "database full").
	PausedMessages int    `json:"paused_messages,omitempty"`
	Paused         string `json:"paused,omitempty"`
	// Breaker is the state of the consumer's circuit breaker: "closed",
	// "open" (new messages wait) or "half_open" (one probe goes through);
	// absent without a breaker.
	Breaker string `json:"breaker,omitempty"`
}

// readyzTimeout bounds /readyz's checks, so that it answers within a
// second: a database that holds its connections open and answers nothing
// (a black hole) then reads as unavailable at once, instead of the probe
// timing out without an answer.
const readyzTimeout = 750 * time.Millisecond

// unready returns why the service cannot work, or "" when it can: the
// consumers of statuses included, whose attempts pause while the database
// has no space left to write (it answers pings meanwhile).
func unready(ctx context.Context, p httpParams, statuses []middleware.ConsumerStatus) string {
	full := slices.ContainsFunc(statuses, func(s middleware.ConsumerStatus) bool {
		return s.Paused == middleware.PausedDatabaseFull
	})
	switch {
	case !p.Readiness.get():
		return "router not running"
	case !p.Transport.Ready():
		return "transport not connected"
	case p.DB.PingContext(ctx) != nil:
		return "database unavailable"
	case full:
		return "database full"
	}
	return ""
}

func readyzConsumers(statuses []middleware.ConsumerStatus, breakers []middleware.BreakerStatus) []readyzConsumer {
	breaker := make(map[string]string, len(breakers))
	for _, b := range breakers {
		breaker[b.Consumer] = b.State.String()
	}
	out := make([]readyzConsumer, len(statuses))
	for i, s := range statuses {
		out[i] = readyzConsumer{
			Consumer:             s.Consumer,
			FailingMessages:      s.FailingMessages,
			OldestFailingSeconds: s.OldestFailing.Seconds(),
			HoldUpLimitSeconds:   s.HoldUpLimit.Seconds(),
			HeldUp:               s.HeldUp(),
			PausedMessages:       s.PausedMessages,
			Paused:               s.Paused,
			Breaker:              breaker[s.Consumer],
		}
	}
	return out
}
