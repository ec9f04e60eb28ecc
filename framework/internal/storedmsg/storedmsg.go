// Package storedmsg turns the stored form of a message, a row of a SQL
// transport, into a watermill message, whatever the row holds.
//
// A row written by hand or by another program may carry metadata that is
// not a JSON object of strings. A transport that failed on such a row
// would never move past it and the consumer would stall; one that guessed
// would hand the chain values nobody published. Instead the message is
// delivered with framework.MetadataUnreadable set and its stored metadata
// kept as text, and the chain dead-letters it with
// framework.CodeUnreadableMessage: the offset moves on, and the operator
// sees the row as it was.
package storedmsg

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/effectively-once/effectively/framework"
)

// Message returns the message of a stored row: its UUID, payload and
// metadata text. Empty or null metadata is no metadata. A stored
// framework.MetadataRedelivered is left out: whether a message was
// delivered before is the transport's to tell, never the row's (a row
// inserted by hand saying "false" would keep a message that kills its
// process from ever being counted towards the delivery limit). So are a
// stored framework.MetadataUnreadable and MetadataUnreadableRaw, which
// this function alone sets.
func Message(uuid string, payload, metadata []byte) *message.Message {
	msg := message.NewMessage(uuid, payload)
	md, reason := Metadata(metadata)
	// The transport's words, not the row's: a row saying it is
	// unreadable would have a good event dead-lettered.
	delete(md, framework.MetadataRedelivered)
	delete(md, framework.MetadataUnreadable)
	delete(md, framework.MetadataUnreadableRaw)
	if reason != "" {
		md = message.Metadata{
			framework.MetadataUnreadable:    reason,
			framework.MetadataUnreadableRaw: printable(metadata),
		}
	}
	msg.Metadata = md
	return msg
}

// Metadata decodes stored metadata, a JSON object whose values are strings
// (a null value is left out). When it is not, reason says why and md is
// empty.
func Metadata(text []byte) (md message.Metadata, reason string) {
	md = make(message.Metadata)
	text = bytes.TrimSpace(text)
	if len(text) == 0 || string(text) == "null" {
		return md, ""
	}
	if !utf8.Valid(text) {
		return make(message.Metadata), "metadata is not valid UTF-8"
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(text, &raw); err != nil {
		return make(message.Metadata), "metadata is not a JSON object"
	}
	for k, v := range raw {
		if string(v) == "null" {
			continue
		}
		var s string
		if err := json.Unmarshal(v, &s); err != nil {
			return make(message.Metadata), "metadata value is not a string"
		}
		md[k] = s
	}
	return md, ""
}

// maxRaw bounds the stored metadata text kept on an unreadable message.
const maxRaw = 8 << 10

// printable returns text as a string any store holds: valid UTF-8
// without NUL, at most maxRaw bytes.
func printable(text []byte) string {
	if len(text) > maxRaw {
		text = text[:maxRaw]
	}
	s := strings.ToValidUTF8(string(text), "\uFFFD")
	return strings.ReplaceAll(s, "\x00", "\uFFFD")
}
