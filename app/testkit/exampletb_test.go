package testkit_test

import (
	"context"
	"fmt"
	"os"
	"testing"
)

// exampleTB is the testing.TB of this package's examples, which get no
// *testing.T (River's examples do the same with its PanicTB): a failure
// panics, TempDir makes a directory that Done removes, and Done runs the
// cleanups, last registered first. The embedded TB is nil: the kit calls
// only the methods defined here.
type exampleTB struct {
	testing.TB
	cleanups []func()
}

func newExampleTB() *exampleTB { return &exampleTB{} }

// Done runs the cleanups, as the end of a test does.
func (t *exampleTB) Done() {
	for i := len(t.cleanups) - 1; i >= 0; i-- {
		t.cleanups[i]()
	}
}

func (t *exampleTB) Helper()                   {}
func (t *exampleTB) Name() string              { return "Example" }
func (t *exampleTB) Context() context.Context  { return context.Background() }
func (t *exampleTB) Cleanup(f func())          { t.cleanups = append(t.cleanups, f) }
func (t *exampleTB) Logf(string, ...any)       {}
func (t *exampleTB) Errorf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (t *exampleTB) Fatalf(f string, a ...any) { panic(fmt.Sprintf(f, a...)) }
func (t *exampleTB) FailNow()                  { panic("FailNow") }

func (t *exampleTB) TempDir() string {
	dir, err := os.MkdirTemp("", "testkit-example")
	if err != nil {
		panic(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}
