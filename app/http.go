package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/jmoiron/sqlx"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/middleware"
)

// Readiness says whether the application consumes: true once the router
// runs, false once it stops.
type Readiness struct{ ready atomic.Bool }

// Ready reports whether the router runs.
func (r *Readiness) Ready() bool { return r.ready.Load() }

func (r *Readiness) set(v bool) { r.ready.Store(v) }

// Metrics is the application's Prometheus registry, served on /metrics,
// with the consumers' metrics and the Go runtime's registered.
type Metrics struct {
	*prometheus.Registry
}

// NewMetrics returns a fresh registry (never the global one) and the
// consumers' metrics registered on it.
func NewMetrics() (Metrics, *middleware.Metrics, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m, err := middleware.NewMetrics(reg)
	if err != nil {
		return Metrics{}, nil, err
	}
	return Metrics{reg}, m, nil
}

// HTTPParams are what NewHTTP takes from fx.
type HTTPParams struct {
	fx.In

	Lifecycle fx.Lifecycle
	Config    Config
	Metrics   Metrics
	Readiness *Readiness
	Transport *Transport
	DB        *sqlx.DB
	Logger    *slog.Logger `optional:"true"`
}

// HTTP serves /healthz (the process lives), /readyz (the router runs, the
// transport is connected and the database answers) and /metrics on
// Config.HTTPAddr.
type HTTP struct {
	addr atomic.Value // string
}

// Addr returns the address the server listens on, once started; empty when
// HTTP is off.
func (h *HTTP) Addr() string {
	a, _ := h.addr.Load().(string)
	return a
}

// NewHTTP builds the server; it listens when the application starts.
func NewHTTP(p HTTPParams) *HTTP {
	h := &HTTP{}
	if p.Config.HTTPAddr == "" {
		return h
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
		defer cancel()
		if !p.Readiness.Ready() {
			http.Error(w, "router not running", http.StatusServiceUnavailable)
			return
		}
		if !p.Transport.Ready() {
			http.Error(w, "transport not connected", http.StatusServiceUnavailable)
			return
		}
		if err := p.DB.PingContext(ctx); err != nil {
			http.Error(w, "database unavailable", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(p.Metrics.Registry, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	p.Lifecycle.Append(fx.Hook{
		OnStart: func(context.Context) error {
			ln, err := net.Listen("tcp", p.Config.HTTPAddr)
			if err != nil {
				return fmt.Errorf("EFFECTIVELY_HTTP_ADDR: listen on %s: %w", p.Config.HTTPAddr, err)
			}
			h.addr.Store(ln.Addr().String())
			go func() {
				if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
					orDefault(p.Logger).Error("http server stopped", "error", err)
				}
			}()
			return nil
		},
		OnStop: srv.Shutdown,
	})
	return h
}
