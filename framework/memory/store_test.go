package memory

import (
	"testing"

	"github.com/effectively-once/effectively/framework/storetest"
)

func TestStore(t *testing.T) {
	t.Parallel()
	storetest.Exercise(t, func(t *testing.T) storetest.Harness {
		return storetest.Harness{
			NewStore: func(t *testing.T, cfg storetest.Config) storetest.Store {
				s := NewStore()
				if cfg.Now != nil {
					s.now = cfg.Now
				}
				return s
			},
		}
	})
}
