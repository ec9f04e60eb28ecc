package amqp

import "sync"

// maxLost bounds lostDeliveries: past it, the oldest are forgotten, and
// their redeliveries are counted as any.
const maxLost = 65_536

// lostDeliveries remembers the messages that were in flight, handed to
// the reader, on a channel that was lost with its connection (a broker
// restart, a network outage), by queue and message id. The broker
// delivers each again on the next channel, flagged redelivered; for the
// one this process takes back, that redelivery is the same delivery
// resumed, not another, and take says so: the outage is not charged to
// the message (the delivery guard counts redeliveries towards the
// consumer's max_deliveries). A message a process freezes or crashes
// under is not one: its process is gone, and with it what it remembered.
type lostDeliveries struct {
	mu    sync.Mutex
	keys  map[lostKey]struct{}
	order []lostKey // ring of the keys, oldest at next once full
	next  int
}

type lostKey struct{ queue, id string }

// add remembers the message id of queue.
func (l *lostDeliveries) add(queue, id string) {
	k := lostKey{queue, id}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.keys == nil {
		l.keys = make(map[lostKey]struct{})
	}
	if _, ok := l.keys[k]; ok {
		return
	}
	if len(l.order) < maxLost {
		l.order = append(l.order, k)
	} else {
		delete(l.keys, l.order[l.next])
		l.order[l.next] = k
		l.next = (l.next + 1) % maxLost
	}
	l.keys[k] = struct{}{}
}

// take reports whether the message id of queue was lost in flight, and
// forgets it: only its first redelivery is the lost delivery's.
func (l *lostDeliveries) take(queue, id string) bool {
	k := lostKey{queue, id}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.keys[k]; !ok {
		return false
	}
	delete(l.keys, k) // its place in order is reused when it comes round
	return true
}
