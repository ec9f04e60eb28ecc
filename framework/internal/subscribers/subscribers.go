// Package subscribers keeps the subscribers a transport hands out, so that
// closing the transport closes them, once.
package subscribers

import (
	"errors"
	"io"
	"sync"
)

// Set holds subscribers until Close. The zero Set is ready to use.
type Set struct {
	mu   sync.Mutex
	subs []io.Closer
}

// Add keeps sub, to close it with the set.
func (s *Set) Add(sub io.Closer) {
	s.mu.Lock()
	s.subs = append(s.subs, sub)
	s.mu.Unlock()
}

// Close closes every subscriber added so far, then each of after (the
// publisher, a connection or a pool: what the subscribers used), and joins
// their errors. A second Close closes no subscriber again.
func (s *Set) Close(after ...io.Closer) error {
	s.mu.Lock()
	subs := s.subs
	s.subs = nil
	s.mu.Unlock()
	errs := make([]error, 0, len(subs)+len(after))
	for _, sub := range subs {
		errs = append(errs, sub.Close())
	}
	for _, c := range after {
		errs = append(errs, c.Close())
	}
	return errors.Join(errs...)
}
