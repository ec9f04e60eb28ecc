package memory_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/driver/storetest"
	"github.com/effectively-once/effectively/framework/memory"
)

func TestStore(t *testing.T) {
	t.Parallel()
	harness := func(t *testing.T) storetest.Harness {
		return storetest.Harness{
			NewStore: func(t *testing.T, cfg storetest.Config) driver.Store {
				s, err := memory.NewStore(memory.StoreConfig{Now: cfg.Now})
				require.NoError(t, err)
				return s
			},
		}
	}
	storetest.Exercise(t, harness)
	storetest.ExerciseInspector(t, harness)
}

func TestStoreConfig(t *testing.T) {
	t.Parallel()
	require.ErrorContains(t, memory.StoreConfig{}.Validate(), "Now")
	require.NoError(t, memory.StoreConfig{}.WithDefaults().Validate())
	s, err := memory.NewStore(memory.StoreConfig{})
	require.NoError(t, err)
	require.NotNil(t, s)
}
