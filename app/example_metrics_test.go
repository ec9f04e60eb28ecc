package app_test

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app/apptest"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

// A service counts what it does with Prometheus collectors of its own,
// registered on the application's registry (the prometheus.Registerer that
// app.Module provides): /metrics serves them beside the framework's. Here
// the prometheus.Gatherer that the application provides too reads the
// counter back, as a scrape of /metrics would.
func Example_metrics() {
	ctx := context.Background()
	// snippet:begin metrics
	archived := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "billing_invoices_archived_total",
		Help: "Invoices the archive took.",
	})
	// In the service's module, beside its consumers:
	register := fx.Invoke(func(reg prometheus.Registerer) error { return reg.Register(archived) })
	// snippet:end metrics
	var gatherer prometheus.Gatherer
	module := fx.Options(
		register,
		handlers.Register("billing.archive-invoice",
			handlers.On(InvoiceSent, func(_ context.Context, _ framework.Event[InvoiceSentV1]) error {
				archived.Inc()
				return nil
			}),
		),
		fx.Populate(&gatherer),
	)
	svc, err := apptest.Start(ctx, module, apptest.Config{}) // the application on a fresh SQLite file
	if err != nil {
		panic(err)
	}
	defer func() {
		if err := svc.Close(ctx); err != nil {
			fmt.Println(err)
		}
	}()

	env, err := InvoiceSent.Envelope(InvoiceSentV1{InvoiceID: "inv-1"}, framework.Attributes{ID: "evt-1", Source: "billing"})
	if err != nil {
		panic(err)
	}
	if _, err := svc.Publish(ctx, env); err != nil {
		panic(err)
	}
	families, err := gatherer.Gather()
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() == "billing_invoices_archived_total" {
			fmt.Println(f.GetName(), f.GetMetric()[0].GetCounter().GetValue())
		}
	}
	// Output:
	// billing_invoices_archived_total 1
}
