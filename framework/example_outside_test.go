package framework_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// A handler that calls an HTTP service passes the event's idempotency key
// in the request, so that the service acts once however often the handler
// runs: a failed attempt rolls back its writes, not the call, and its
// retry calls again with the same key.
func Example_outsideCall() {
	ctx := context.Background()
	uow, done := exampleUnitOfWork(ctx)
	defer done()

	// The other team's service: it sends an e-mail once per key.
	var (
		mu   sync.Mutex
		sent = map[string]bool{}
	)
	mailer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		key := r.Header.Get("Idempotency-Key")
		if sent[key] {
			fmt.Println("mailer: already sent")
			return
		}
		sent[key] = true
		fmt.Println("mailer: sent")
	}))
	defer mailer.Close()

	failures := 1 // the first attempt fails after the call
	consumer, err := framework.NewConsumer("billing.receipt-by-mail",
		framework.Handle(Captured, func(ctx context.Context, ev framework.Event[PaymentCaptured]) error {
			// snippet:begin outside-call
			key, _ := framework.IdempotencyKeyFromContext(ctx)
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, mailer.URL+"/receipts", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Idempotency-Key", key) // the same on every run of this event
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("mailer: %w", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				return fmt.Errorf("mailer: %s", resp.Status)
			}
			// snippet:end outside-call
			if failures > 0 {
				failures--
				return errors.New("database is busy")
			}
			return nil
		}),
	)
	if err != nil {
		panic(err)
	}

	env, err := Captured.Envelope(PaymentCaptured{OrderID: "o-1", Cents: 4200}, framework.Attributes{ID: "evt-1", Source: "payments"})
	if err != nil {
		panic(err)
	}
	body, err := framework.Encode(env)
	if err != nil {
		panic(err)
	}
	for range 2 { // the failed attempt rolled back: the message comes again
		outcome, err := driver.Consume(ctx, consumer, uow, body)
		fmt.Println(outcome, err)
	}
	// Output:
	// mailer: sent
	// failed database is busy
	// mailer: already sent
	// processed <nil>
}
