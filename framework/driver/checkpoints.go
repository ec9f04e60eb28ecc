package driver

import "sync"

// maxKnownCheckpoints bounds knownCheckpoints: past it, the checkpoints
// known are forgotten at once, and read again from the store.
const maxKnownCheckpoints = 1 << 16

// checkpointKey names a subject's checkpoint.
type checkpointKey struct{ consumer, subject string }

// knownCheckpoints are the strict-order checkpoints that this process's
// batches committed, so that a batch whose events are at their turn by
// them moves their checkpoints before its handlers run, from the known
// ones with a compare-and-set, in the statement that marks its events
// (see markMover): the batch then makes as many statements as an
// unordered one. The compare fails, and the batch's attempts run again
// alone, when another process moved a checkpoint meanwhile. Only a
// commit sets one, so that an event runs once its predecessor's effect is
// committed and seen.
type knownCheckpoints struct {
	mu   sync.Mutex
	seqs map[checkpointKey]int64
}

// turn reports the checkpoint of (consumer, subject) known to this
// process when the event seq is at its turn by it. A subject this
// process knows nothing of is taken to be new when seq is 1 (its
// checkpoint 0, none yet), so that a subject's first event moves its
// checkpoint as later ones do, instead of reading and locking it, then
// moving it after its handler in a statement of its own: where it is not
// new after all (another process, or this one before a restart, took
// its first event), the move's compare fails and the batch's attempts
// run again alone.
func (k *knownCheckpoints) turn(consumer, subject string, seq int64) (int64, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	c, ok := k.seqs[checkpointKey{consumer, subject}]
	if !ok {
		return 0, seq == 1
	}
	return c, seq == c+1
}

// committed records the checkpoints of consumer that a batch's commit
// moved to seqs, by subject.
func (k *knownCheckpoints) committed(consumer string, seqs map[string]int64) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.seqs == nil || len(k.seqs)+len(seqs) > maxKnownCheckpoints {
		k.seqs = make(map[checkpointKey]int64, len(seqs))
	}
	for s, c := range seqs {
		k.seqs[checkpointKey{consumer, s}] = c
	}
}

// forget forgets the checkpoints of consumer's subjects, whose move
// failed its compare-and-set.
func (k *knownCheckpoints) forget(consumer string, subjects []string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, s := range subjects {
		delete(k.seqs, checkpointKey{consumer, s})
	}
}
