package middleware_test

import (
	"context"
	"fmt"
	"runtime/metrics"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/memory"
	"github.com/effectively-once/effectively/middleware"
)

// memoryChain returns a consumer's whole chain as a service has it (the
// default settings, metrics), on the memory store and a unit of work
// without a database, whose handler does nothing; and n messages of
// distinct typical events, as a transport that tells first deliveries
// hands them out. What it costs is the chain's own: decoding, routing,
// validating, and the steps.
func memoryChain(tb testing.TB, n int) (message.NoPublishHandlerFunc, []*message.Message) {
	tb.Helper()
	s, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(tb, err)
	c, err := framework.NewConsumer(consumerName, framework.Handle(noted, func(context.Context, framework.Event[noteV1]) error {
		return nil
	}))
	require.NoError(tb, err)
	uow, err := driver.NewUnitOfWork(driver.UnitOfWorkConfig{Store: s})
	require.NoError(tb, err)
	m, err := middleware.NewMetrics(prometheus.NewRegistry())
	require.NoError(tb, err)
	h, _, err := middleware.Handler(middleware.Config{Consumer: c, UnitOfWork: uow, Store: s, Metrics: m})
	require.NoError(tb, err)
	msgs := make([]*message.Message, n)
	for i := range msgs {
		env, err := noted.Envelope(noteV1{Text: "hello"}, framework.Attributes{
			ID: fmt.Sprint(i), Source: "bench", Subject: fmt.Sprint("subject-", i%100),
		})
		require.NoError(tb, err)
		payload, err := framework.Encode(env)
		require.NoError(tb, err)
		msgs[i] = message.NewMessage(fmt.Sprint(i), payload)
		msgs[i].Metadata.Set(framework.MetadataRedelivered, "false")
	}
	return h, msgs
}

// TestChainAllocations pins what a message costs the chain in allocations
// on the memory store: the decode (2), the data's decoding and
// validation (encoding/json's, the event, the call), the message's state
// and context values, the attempt's timeout, and the unit of work's and
// the store's own. No step allocates a closure, a backoff or a span's
// options per message (with the default no-op tracer).
func TestChainAllocations(t *testing.T) {
	const runs = 200
	h, msgs := memoryChain(t, runs+1)
	next := 0
	allocs := testing.AllocsPerRun(runs, func() {
		if err := h(msgs[next]); err != nil {
			t.Fatal(err)
		}
		next++
	})
	// 30 this way on Go 1.26; one more for the memory store's maps, which
	// grow unevenly.
	require.LessOrEqual(t, allocs, 31.0+raceAllocs)
}

// TestChainStartsNoGoroutine: the chain handles a message on the
// goroutine it is given (the router's), starting none of its own.
func TestChainStartsNoGoroutine(t *testing.T) {
	const n = 100
	h, msgs := memoryChain(t, n)
	before := goroutinesCreated()
	for _, msg := range msgs {
		require.NoError(t, h(msg))
	}
	// Other tests' leftovers may start a few meanwhile; one per message
	// would be n.
	require.Less(t, goroutinesCreated()-before, uint64(n/10))
}

// goroutinesCreated returns how many goroutines the process started.
func goroutinesCreated() uint64 {
	s := []metrics.Sample{{Name: "/sched/goroutines-created:goroutines"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}
