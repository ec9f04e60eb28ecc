package soak

import (
	"fmt"
	"math/rand/v2"
	"slices"
)

// SubjectLength is how many events each subject of a Plan has, in
// sequence 1..SubjectLength.
const SubjectLength = 10

// Item is one distinct event of a Plan.
type Item struct {
	// ID is the event id (source Source).
	ID string
	// Subject and Seq are the event's subject and subjectseq.
	Subject string
	Seq     int64
	// Prev is the sequence of the subject's previous event that is not
	// poison, zero for none: the projection checks it applied that one
	// last.
	Prev int64
	// Poison events are dead letters in every consumer: refused by the
	// handlers (code poison), or, when Undecodable, of a version no
	// consumer knows, without a subject.
	Poison      bool
	Undecodable bool
	// FailFirst events fail their first attempt in each consumer.
	FailFirst bool
	// Duplicate events are published a second time, outside the outbox.
	Duplicate bool
}

// Plan is what the producer writes, in order, and what the soak expects.
type Plan struct {
	// Items are the distinct events in the order the producer writes
	// them: subjects interleaved, some neighbours of a subject swapped.
	Items []Item
}

// Shares of a Plan's events.
const (
	duplicateShare = 0.05 // of the events sent
	poisonShare    = 0.01 // of the distinct events
	failFirstShare = 0.02 // of the distinct events
	swapShare      = 0.2  // of each subject's neighbours
	subjectsAtOnce = 50   // subjects interleaved in the write order
)

// NewPlan returns the plan of sent events (distinct events and their
// duplicates), the same for the same seed.
func NewPlan(sent int, seed uint64) Plan {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	distinct := sent - int(float64(sent)*duplicateShare)
	items := make([]Item, distinct)
	for i := range items {
		s, n := i/SubjectLength, int64(i%SubjectLength)+1
		items[i] = Item{ID: fmt.Sprintf("e%06d", i), Subject: fmt.Sprintf("s%05d", s), Seq: n}
	}
	perm := rng.Perm(distinct)
	nPoison, nFail, nDup := share(distinct, poisonShare), share(distinct, failFirstShare), sent-distinct
	for k, i := range perm {
		switch {
		case k < nPoison:
			items[i].Poison = true
		case k < nPoison+nFail:
			items[i].FailFirst = true
		}
	}
	for _, i := range rng.Perm(distinct)[:nDup] {
		items[i].Duplicate = true
	}
	for k, i := range perm[:nPoison] {
		items[i].Undecodable = k%2 == 1
	}
	sequence(items)
	return Plan{Items: interleave(rng, items)}
}

// sequence numbers each subject's events but the undecodable ones,
// which have no subject, and sets each one's Prev.
func sequence(items []Item) {
	var prev, n int64
	for i := range items {
		it := &items[i]
		if i%SubjectLength == 0 {
			prev, n = 0, 0
		}
		if it.Undecodable {
			it.Subject, it.Seq = "", 0
			continue
		}
		n++
		it.Seq, it.Prev = n, prev
		if !it.Poison {
			prev = n
		}
	}
}

func share(n int, f float64) int { return int(float64(n) * f) }

// interleave returns items in a write order: subjectsAtOnce subjects at
// a time, the next event drawn from one of them at random, each
// subject's events in sequence but for neighbours swapped at random (a
// subject's first event too: under strict_order its sequence starts at 1,
// whatever arrives first).
func interleave(rng *rand.Rand, items []Item) []Item {
	block := subjectsAtOnce * SubjectLength
	var out []Item
	for start := 0; start < len(items); start += block {
		var queues [][]Item
		for s := start; s < min(start+block, len(items)); s += SubjectLength {
			q := slices.Clone(items[s:min(s+SubjectLength, len(items))])
			swapNeighbours(rng, q)
			queues = append(queues, q)
		}
		out = append(out, drawAtRandom(rng, queues)...)
	}
	return out
}

// swapNeighbours swaps some neighbours of q, each event moving once at
// most.
func swapNeighbours(rng *rand.Rand, q []Item) {
	for k := 0; k+1 < len(q); k++ {
		if rng.Float64() < swapShare {
			q[k], q[k+1] = q[k+1], q[k]
			k++
		}
	}
}

// drawAtRandom empties queues into one list, taking the head of a queue
// drawn at random each time.
func drawAtRandom(rng *rand.Rand, queues [][]Item) []Item {
	var out []Item
	for len(queues) > 0 {
		k := rng.IntN(len(queues))
		if len(queues[k]) == 0 {
			queues = append(queues[:k], queues[k+1:]...)
			continue
		}
		out = append(out, queues[k][0])
		queues[k] = queues[k][1:]
	}
	return out
}

// Figures are what a Plan expects.
type Figures struct {
	Sent, Distinct, Poison, FailFirst, Duplicates int
}

// Figures counts the plan's events.
func (p Plan) Figures() Figures {
	f := Figures{Distinct: len(p.Items)}
	for _, it := range p.Items {
		f.Sent++
		if it.Duplicate {
			f.Duplicates++
			f.Sent++
		}
		if it.Poison {
			f.Poison++
		}
		if it.FailFirst {
			f.FailFirst++
		}
	}
	return f
}

// Expected returns, per subject, the last sequence the projection applies
// and how many of the subject's events it applies.
func (p Plan) Expected() map[string][2]int64 {
	m := map[string][2]int64{}
	for _, it := range p.Items {
		if it.Poison || it.Subject == "" {
			continue
		}
		e := m[it.Subject]
		e[0] = max(e[0], it.Seq)
		e[1]++
		m[it.Subject] = e
	}
	return m
}
