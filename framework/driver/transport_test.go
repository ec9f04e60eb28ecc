package driver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework/driver"
)

// TestSubscribeConfig shows the defaults of a subscription request and
// that each invalid field is named in its error.
func TestSubscribeConfig(t *testing.T) {
	t.Parallel()
	ok := driver.SubscribeConfig{Consumer: "c", Types: []string{"a"}}
	require.Equal(t, 1, ok.WithDefaults().Concurrency)
	require.NoError(t, ok.WithDefaults().Validate())
	for field, cfg := range map[string]driver.SubscribeConfig{
		"Consumer":       {Types: []string{"a"}, Concurrency: 1},
		"Types":          {Consumer: "c", Concurrency: 1},
		"Concurrency":    {Consumer: "c", Types: []string{"a"}},
		"AttemptTimeout": {Consumer: "c", Types: []string{"a"}, Concurrency: 1, AttemptTimeout: -1},
		"HandlingTime":   {Consumer: "c", Types: []string{"a"}, Concurrency: 1, HandlingTime: -1},
	} {
		require.ErrorContains(t, cfg.Validate(), "SubscribeConfig."+field, field)
	}
}

// TestReplayTopics: the consumer's replay topic, then each former name's
// once, the blank one and the consumer's own left out.
func TestReplayTopics(t *testing.T) {
	t.Parallel()
	require.Equal(t, []string{"effectively.replay.c"}, driver.SubscribeConfig{Consumer: "c"}.ReplayTopics())
	require.Equal(t,
		[]string{"effectively.replay.c", "effectively.replay.a", "effectively.replay.b"},
		driver.SubscribeConfig{Consumer: "c", FormerNames: []string{"a", "", "c", "a", "b"}}.ReplayTopics())
}
