package apptest

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/internal/crash"
	"github.com/effectively-once/effectively/middleware"
)

// outcome is what a consumer's chain reported of one delivery, or why it
// reported nothing.
type outcome struct {
	res testkit.Result
	err error
}

// messageWait is an outcome expected of one message at one consumer.
type messageWait struct{ consumer, uuid string }

// eventWait selects the outcomes of one event at one consumer.
type eventWait struct {
	consumer string
	key      framework.Key
}

// outcomes hands the outcome of each delivery, as the chain reported it
// (middleware.ReportOf), to the test that waits for it: by message when
// the test sent the message itself, else by event (Await).
type outcomes struct {
	mu       sync.Mutex
	expected map[messageWait]chan outcome
	// others holds the outcomes nobody expected by message, oldest first.
	others map[eventWait][]outcome
	// changed is closed, and replaced, when others grows.
	changed chan struct{}
}

func newOutcomes() *outcomes {
	return &outcomes{
		expected: make(map[messageWait]chan outcome),
		others:   make(map[eventWait][]outcome),
		changed:  make(chan struct{}),
	}
}

// observe is a router middleware, outside every consumer's chain: it
// reads the outcome the chain reported once the chain returned.
func (o *outcomes) observe(next message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		out, err := next(msg)
		o.report(msg, err)
		return out, err
	}
}

func (o *outcomes) report(msg *message.Message, herr error) {
	// The application names each router handler "<consumer>@<topic>",
	// with "#n" after it for the n-th of several; a consumer name has no
	// "@".
	consumer, _, _ := strings.Cut(message.HandlerNameFromCtx(msg.Context()), "@")
	var oc outcome
	if at, ok := crash.PointOf(herr); ok {
		oc.res = testkit.Result{Outcome: testkit.Crashed, CrashedAt: at, Err: herr}
	} else if rep, ok := middleware.ReportOf(msg); ok {
		oc.res = testkit.Result{Outcome: rep.Outcome, Code: rep.Code, Attempts: rep.Attempts, Err: herr}
	} else {
		oc.err = fmt.Errorf("the chain reported no outcome (handler error: %w)", herr)
	}

	o.mu.Lock()
	defer o.mu.Unlock()
	w := messageWait{consumer: consumer, uuid: msg.UUID}
	if ch, ok := o.expected[w]; ok {
		delete(o.expected, w)
		ch <- oc // buffered: never blocks
		return
	}
	ew := eventWait{consumer: consumer, key: keyOf(msg.Payload)}
	o.others[ew] = append(o.others[ew], oc)
	close(o.changed)
	o.changed = make(chan struct{})
}

// keyOf returns the key of the event in body, or framework.BodyKey(body)
// when its envelope does not decode.
func keyOf(body []byte) framework.Key {
	env, err := framework.Decode(body, 0)
	if err != nil {
		return framework.BodyKey(body)
	}
	return env.Key()
}

// expect registers the outcome of message uuid at each of consumers as
// expected, before the message is sent.
func (o *outcomes) expect(uuid string, consumers []string) map[string]chan outcome {
	o.mu.Lock()
	defer o.mu.Unlock()
	waits := make(map[string]chan outcome, len(consumers))
	for _, c := range consumers {
		ch := make(chan outcome, 1)
		o.expected[messageWait{consumer: c, uuid: uuid}] = ch
		waits[c] = ch
	}
	return waits
}

// forget stops expecting outcomes of message uuid: those that come later
// (redeliveries) are kept for Await.
func (o *outcomes) forget(uuid string, consumers []string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, c := range consumers {
		delete(o.expected, messageWait{consumer: c, uuid: uuid})
	}
}

// await returns the oldest outcome of w not yet returned, waiting for one
// until ctx ends.
func (o *outcomes) await(ctx context.Context, w eventWait) (testkit.Result, error) {
	for {
		o.mu.Lock()
		if q := o.others[w]; len(q) > 0 {
			oc := q[0]
			o.others[w] = q[1:]
			o.mu.Unlock()
			return oc.res, oc.err
		}
		changed := o.changed
		o.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
			return testkit.Result{}, context.Cause(ctx)
		}
	}
}
