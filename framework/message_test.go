package framework_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

func TestDeadLetterReplayMessage(t *testing.T) {
	t.Parallel()
	dl := driver.DeadLetter{
		ID:   42,
		Body: []byte(`{"specversion":"1.0"}`),
		Metadata: map[string]string{
			framework.MetadataContentType:   framework.ContentType,
			framework.MetadataRedelivered:   "true",
			framework.MetadataUnreadable:    "metadata is not a JSON object",
			framework.MetadataUnreadableRaw: `["a"]`,
			framework.MetadataPublishedAt:   "2026-12-01T10:00:00Z",
			"traceparent-carrier":           "kept",
		},
	}
	msg := dl.ReplayMessage()
	require.Equal(t, dl.Body, []byte(msg.Payload), "the original body")
	require.Equal(t, framework.ContentType, msg.Metadata.Get(framework.MetadataContentType))
	require.Equal(t, "kept", msg.Metadata.Get("traceparent-carrier"))
	require.NotContains(t, msg.Metadata, framework.MetadataRedelivered, "a replay is a first delivery")
	// Published anew, with metadata its transport reads: it was
	// dead-lettered as unreadable_message again, whatever the fix.
	require.NotContains(t, msg.Metadata, framework.MetadataUnreadable)
	require.NotContains(t, msg.Metadata, framework.MetadataUnreadableRaw)
	require.NotContains(t, msg.Metadata, framework.MetadataPublishedAt, "its transport tells the replay's own")
	require.Equal(t, "42", msg.Metadata.Get(framework.MetadataReplayOf))
	require.NotEqual(t, dl.ReplayMessage().UUID, msg.UUID, "each replay is a message of its own")
}
