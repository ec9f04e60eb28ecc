package subscribers

import (
	"errors"
	"testing"
)

type closer struct {
	closed *[]string
	name   string
	err    error
}

func (c closer) Close() error {
	*c.closed = append(*c.closed, c.name)
	return c.err
}

func TestSetClose(t *testing.T) {
	t.Parallel()
	var closed []string
	boom := errors.New("boom")
	var s Set
	s.Add(closer{&closed, "a", nil})
	s.Add(closer{&closed, "b", boom})
	err := s.Close(closer{&closed, "pub", nil})
	if !errors.Is(err, boom) {
		t.Fatalf("Close = %v, want the subscriber's error", err)
	}
	if got := len(closed); got != 3 || closed[0] != "a" || closed[1] != "b" || closed[2] != "pub" {
		t.Fatalf("closed %v, want subscribers first, then the rest", closed)
	}
	if err := s.Close(); err != nil || len(closed) != 3 {
		t.Fatalf("second Close = %v, closed %v: want nothing closed again", err, closed)
	}
}
