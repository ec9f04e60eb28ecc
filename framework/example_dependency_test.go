package framework_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/effectively-once/effectively/framework"
)

// A handler marks the failure of a service it calls as a dependency
// failure: the message is retried as usual, and the consumer's circuit
// breaker counts it.
func ExampleDependency() {
	reserve := func(context.Context, string) error { return errors.New("connection refused") }
	handle := func(ctx context.Context, order string) error {
		if err := reserve(ctx, order); err != nil {
			return framework.Dependency(fmt.Errorf("reserve stock: %w", err))
		}
		return nil
	}

	err := handle(context.Background(), "order-7")
	fmt.Println(framework.IsDependency(err), framework.IsPermanent(err), framework.CodeOf(err))
	fmt.Println(err)
	// Output:
	// true false retries_exhausted
	// dependency failed: reserve stock: connection refused
}
