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
// this function alone sets, and framework.MetadataPublishedAt, which the
// transport sets from the row's created_at.
func Message(uuid string, payload, metadata []byte) *message.Message {
	msg := message.NewMessage(uuid, payload)
	md, reason := Metadata(metadata)
	// The transport's words, not the row's: a row saying it is
	// unreadable would have a good event dead-lettered.
	delete(md, framework.MetadataRedelivered)
	delete(md, framework.MetadataUnreadable)
	delete(md, framework.MetadataUnreadableRaw)
	delete(md, framework.MetadataPublishedAt)
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
	text = bytes.TrimSpace(text)
	if len(text) == 0 || string(text) == "null" {
		return make(message.Metadata), ""
	}
	if !utf8.Valid(text) {
		return make(message.Metadata), "metadata is not valid UTF-8"
	}
	if md, ok := plainMetadata(text); ok {
		return md, ""
	}
	return jsonMetadata(text)
}

// jsonMetadata is Metadata of valid UTF-8 text, read with encoding/json.
func jsonMetadata(text []byte) (md message.Metadata, reason string) {
	md = make(message.Metadata)
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

// plainMetadata reads text, trimmed and valid UTF-8, when it is a JSON
// object whose keys and values are strings without escapes or control
// characters, the usual metadata ({"content-type":"..."}), in one scan
// and without reflection; ok is false for anything else, which
// jsonMetadata reads. A repeated key keeps its last value, as
// encoding/json does.
func plainMetadata(text []byte) (md message.Metadata, ok bool) {
	i := 0
	space := func() {
		for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
			i++
		}
	}
	str := func() (string, bool) {
		if i >= len(text) || text[i] != '"' {
			return "", false
		}
		start := i + 1
		for i = start; i < len(text); i++ {
			switch c := text[i]; {
			case c == '"':
				i++
				return string(text[start : i-1]), true
			case c == '\\' || c < 0x20:
				return "", false
			}
		}
		return "", false
	}
	space()
	if i >= len(text) || text[i] != '{' {
		return nil, false
	}
	i++
	space()
	md = make(message.Metadata, 2)
	if i < len(text) && text[i] == '}' {
		i++
		space()
		return md, i == len(text)
	}
	for {
		k, ok := str()
		if !ok {
			return nil, false
		}
		space()
		if i >= len(text) || text[i] != ':' {
			return nil, false
		}
		i++
		space()
		v, ok := str()
		if !ok {
			return nil, false
		}
		md[k] = v
		space()
		if i >= len(text) {
			return nil, false
		}
		switch text[i] {
		case ',':
			i++
			space()
		case '}':
			i++
			space()
			return md, i == len(text)
		default:
			return nil, false
		}
	}
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
