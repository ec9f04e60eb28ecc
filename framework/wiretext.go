package framework

import (
	"bytes"
	"encoding/json"
	"net/url"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/effectively-once/effectively/internal/jsonescape"
)

// The characters of a CloudEvents String attribute. CloudEvents 1.0 allows
// any Unicode character but the control characters (U+0000–U+001F and
// U+007F–U+009F), the surrogates (U+D800–U+DFFF; in JSON text only an
// escaped pair that makes one character above U+FFFF) and the
// noncharacters (U+FDD0–U+FDEF and the last two code points of each
// plane). The replacement character U+FFFD is an ordinary character and
// is allowed. A byte that is not UTF-8, or a lone surrogate escape such as
// "\ud800", is refused, although Go's encoding/json would silently turn it
// into U+FFFD: Decode reads the JSON text itself.

// runeProblem says why r may not appear in a String attribute, or "".
func runeProblem(r rune) string {
	switch {
	case r < 0x20 || (r >= 0x7f && r <= 0x9f):
		return "holds a control character"
	case r >= 0xd800 && r <= 0xdfff:
		return "holds an unpaired surrogate"
	case (r >= 0xfdd0 && r <= 0xfdef) || r&0xfffe == 0xfffe:
		return "holds a Unicode noncharacter"
	}
	return ""
}

// stringProblem says why s may not be the value of a String attribute, or
// "".
func stringProblem(s string) string {
	for i := 0; i < len(s); {
		if c := s[i]; c >= 0x20 && c < 0x7f {
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return "is not valid UTF-8"
		}
		if p := runeProblem(r); p != "" {
			return p
		}
		i += size
	}
	return ""
}

// checkString returns the permanent CodeMalformedEnvelope error of
// attribute field when its value s breaks the rules of a String, else nil.
func checkString(field, s string) error {
	if p := stringProblem(s); p != "" {
		return malformed(field, p)
	}
	return nil
}

// eachMember calls fn with the name, decoded, and the value, as written,
// of each member of the JSON object text, in order, until fn returns
// false. Both may share text's bytes. text must be valid JSON
// (json.Valid); ok is false when it is not an object or a member's name
// breaks the rules of a String.
func eachMember(text []byte, fn func(name, value []byte) bool) (ok bool) {
	i := skipSpace(text, 0)
	if i >= len(text) || text[i] != '{' {
		return false
	}
	i = skipSpace(text, i+1)
	if i < len(text) && text[i] == '}' {
		return true
	}
	for i < len(text) {
		end := stringEnd(text, i)
		if end < 0 {
			return false
		}
		name, problem := memberName(text[i:end])
		if problem != "" {
			return false
		}
		i = skipSpace(text, end)
		if i >= len(text) || text[i] != ':' {
			return false
		}
		start := skipSpace(text, i+1)
		end = valueEnd(text, start)
		if end < 0 {
			return false
		}
		if !fn(name, text[start:end]) {
			return true
		}
		i = skipSpace(text, end)
		if i >= len(text) {
			return false
		}
		switch text[i] {
		case '}':
			return true
		case ',':
			i = skipSpace(text, i+1)
		default:
			return false
		}
	}
	return false
}

// memberName decodes the JSON string token raw, a member's name, sharing
// its bytes when it holds no escape.
func memberName(raw []byte) (name []byte, problem string) {
	if bytes.IndexByte(raw, '\\') >= 0 {
		var b []byte
		problem = decodeString(raw, &b)
		return b, problem
	}
	if problem = decodeString(raw, nil); problem != "" {
		return nil, problem
	}
	return raw[1 : len(raw)-1], ""
}

func skipSpace(text []byte, i int) int {
	for i < len(text) && (text[i] == ' ' || text[i] == '\t' || text[i] == '\n' || text[i] == '\r') {
		i++
	}
	return i
}

// stringEnd returns the index after the JSON string that starts at i, or
// -1.
func stringEnd(text []byte, i int) int {
	if i >= len(text) || text[i] != '"' {
		return -1
	}
	for j := i + 1; j < len(text); j++ {
		switch text[j] {
		case '\\':
			j++
		case '"':
			return j + 1
		}
	}
	return -1
}

// valueEnd returns the index after the JSON value that starts at i, or -1.
func valueEnd(text []byte, i int) int {
	if i >= len(text) {
		return -1
	}
	switch text[i] {
	case '"':
		return stringEnd(text, i)
	case '{', '[':
		depth := 0
		for j := i; j < len(text); j++ {
			switch text[j] {
			case '"':
				end := stringEnd(text, j)
				if end < 0 {
					return -1
				}
				j = end - 1
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return j + 1
				}
			}
		}
		return -1
	}
	j := i
	for j < len(text) && !strings.ContainsRune(",}] \t\n\r", rune(text[j])) {
		j++
	}
	return j
}

// unquote decodes the JSON string token raw (quotes included) by the rules
// of a String attribute. problem says why it breaks them, or is "".
func unquote(raw []byte) (s string, problem string) {
	b := make([]byte, 0, len(raw))
	if problem = decodeString(raw, &b); problem != "" {
		return "", problem
	}
	return string(b), ""
}

// decodeString checks the JSON string token raw (quotes included) by the
// rules of a String attribute, and appends its value to out unless out is
// nil. It returns why raw breaks the rules, or "".
func decodeString(raw []byte, out *[]byte) (problem string) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "not a string"
	}
	raw = raw[1 : len(raw)-1]
	for i := 0; i < len(raw); {
		c := raw[i]
		switch {
		case c == '\\':
			r, n := jsonescape.Unescape(raw[i:])
			if n == 0 {
				return "holds an invalid escape"
			}
			if p := runeProblem(r); p != "" {
				return p
			}
			if out != nil {
				*out = utf8.AppendRune(*out, r)
			}
			i += n
		case c < utf8.RuneSelf:
			if p := runeProblem(rune(c)); p != "" {
				return p
			}
			if out != nil {
				*out = append(*out, c)
			}
			i++
		default:
			r, size := utf8.DecodeRune(raw[i:])
			if r == utf8.RuneError && size == 1 {
				return "is not valid UTF-8"
			}
			if p := runeProblem(r); p != "" {
				return p
			}
			if out != nil {
				*out = append(*out, raw[i:i+size]...)
			}
			i += size
		}
	}
	return ""
}

// plainAttribute is one of the attributes that decodePlain reads, as a
// bit of the set it has seen.
type plainAttribute uint16

// The attributes of a plain event (see decodePlain).
const (
	plainSpecVersion plainAttribute = 1 << iota
	plainID
	plainSource
	plainType
	plainVersion
	plainSubject
	plainTime
	plainDataContentType
	plainSubjectSeq
	plainCorrelationID
	plainTraceParent
	plainTraceState
	plainData

	// plainRequired are the attributes every event holds.
	plainRequired = plainSpecVersion | plainID | plainSource | plainType | plainVersion
)

// plainAttributeOf returns the attribute named name as written, without
// escapes; 0 for any other name.
func plainAttributeOf(name []byte) plainAttribute {
	switch string(name) {
	case "specversion":
		return plainSpecVersion
	case "id":
		return plainID
	case "source":
		return plainSource
	case "type":
		return plainType
	case extVersion:
		return plainVersion
	case "subject":
		return plainSubject
	case "time":
		return plainTime
	case "datacontenttype":
		return plainDataContentType
	case extSubjectSeq:
		return plainSubjectSeq
	case extCorrelationID:
		return plainCorrelationID
	case extTraceParent:
		return plainTraceParent
	case extTraceState:
		return plainTraceState
	case "data":
		return plainData
	}
	return 0
}

// decodePlain decodes body in one pass over its JSON text, without the
// CloudEvents SDK, when body is a plain event: a JSON object holding
// specversion "1.0", id, source, type and eventversion, and at most
// subject, time, subjectseq, correlationid, traceparent, tracestate, data
// and a datacontenttype of application/json or text/json; each once,
// under its name written without escapes, with a value that Decode
// accepts. That is what Encode writes, and what producers usually do. ok
// is false for every other body (another attribute, dataschema,
// data_base64, an attribute Decode refuses): Decode leaves it to
// decodeSDK. So a body that decodePlain takes is one that decodeSDK takes,
// to the same envelope (FuzzDecodePlain checks it), and every refusal is
// decodeSDK's, worded as it always was.
func decodePlain(body []byte) (env Envelope, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return Envelope{}, false
	}
	// The attributes written without escapes are substrings of one copy
	// of the text: one allocation for them all.
	text := string(body)
	var seen plainAttribute
	// The scan checks the object's syntax as it goes; each value is
	// checked by what reads it: a string attribute by the rules of a
	// String (stricter than JSON's), any other value and data by
	// json.Valid. What the scan does not take falls back to decodeSDK.
	for i = skipSpace(body, i+1); ; {
		if i >= len(body) || body[i] != '"' {
			return Envelope{}, false
		}
		nameEnd := stringEnd(body, i)
		if nameEnd < 0 {
			return Envelope{}, false
		}
		attr := plainAttributeOf(body[i+1 : nameEnd-1])
		if attr == 0 || seen&attr != 0 {
			return Envelope{}, false
		}
		seen |= attr
		colon := skipSpace(body, nameEnd)
		if colon >= len(body) || body[colon] != ':' {
			return Envelope{}, false
		}
		start := skipSpace(body, colon+1)
		end := valueEnd(body, start)
		if end <= start {
			return Envelope{}, false
		}
		value := body[start:end]
		if (attr == plainData || value[0] != '"') && !json.Valid(value) {
			return Envelope{}, false
		}
		if attr == plainData {
			// As the SDK keeps it: the text from the colon on, the space
			// before the value included.
			env.Data = bytes.Clone(body[colon+1 : end])
		} else if !env.setPlain(attr, value, text[start:end]) {
			return Envelope{}, false
		}
		if i = skipSpace(body, end); i >= len(body) {
			return Envelope{}, false
		}
		if body[i] == '}' {
			break
		}
		if body[i] != ',' {
			return Envelope{}, false
		}
		i = skipSpace(body, i+1)
	}
	if skipSpace(body, i+1) != len(body) || seen&plainRequired != plainRequired || env.Validate() != nil {
		return Envelope{}, false
	}
	return env, true
}

// setPlain sets the attribute attr of a plain event (see decodePlain) from
// its value, raw as written, and text, the same as a string. It reports
// whether the value is one that Decode accepts.
func (env *Envelope) setPlain(attr plainAttribute, raw []byte, text string) bool {
	if attr == plainVersion {
		v, err := parseVersion(raw)
		env.Version = v
		return err == nil
	}
	switch attr {
	case plainSpecVersion:
		return text == `"1.0"`
	case plainDataContentType:
		return text == `"application/json"` || text == `"text/json"`
	}
	s, ok := plainString(raw, text)
	if !ok {
		return false
	}
	switch attr {
	case plainID:
		env.ID = s
		return strings.TrimSpace(s) != "" // as the SDK's validation trims
	case plainSource:
		env.Source, ok = uriReference(s)
		return ok && strings.TrimSpace(env.Source) != ""
	case plainType:
		env.Type = s
		return strings.TrimSpace(s) != ""
	case plainSubject:
		env.Subject = s
		return s == "" || strings.TrimSpace(s) != "" // the SDK drops an empty one
	case plainTime:
		if s == "" {
			return true // the SDK reads it as no time
		}
		t, err := time.Parse(time.RFC3339Nano, s)
		env.Time = t
		return err == nil
	case plainSubjectSeq:
		seq, ok := parseSubjectSeq(s)
		env.SubjectSeq = seq
		return ok
	case plainCorrelationID:
		env.CorrelationID = s
	case plainTraceParent:
		env.TraceParent = s
	case plainTraceState:
		env.TraceState = s
	}
	return true
}

// plainString returns the JSON value raw, written as text, as a String
// attribute: text's own bytes between the quotes when it holds no escape.
// ok is false when raw is not a string or breaks the rules of a String.
func plainString(raw []byte, text string) (s string, ok bool) {
	if raw[0] != '"' {
		return "", false
	}
	if bytes.IndexByte(raw, '\\') >= 0 {
		s, problem := unquote(raw)
		return s, problem == ""
	}
	if decodeString(raw, nil) != "" {
		return "", false
	}
	return text[1 : len(text)-1], true
}

// NormalizeSource returns source as Decode reads an event's source: parsed
// as a URI reference and written back, as the CloudEvents SDK reads it, so
// that the spellings of one URI reference are one source ("a b" and
// "a%20b", "HTTP://h/p" and "http://h/p", "café" and "caf%C3%A9"). The
// keys of the stores hold that form: a source typed by an operator finds
// its records once normalized. A source that does not parse is returned
// as it is.
func NormalizeSource(source string) string {
	if s, ok := uriReference(source); ok {
		return s
	}
	return source
}

// uriReference returns s as the CloudEvents SDK reads a source: parsed as
// a URI reference and written back. ok is false when s does not parse.
func uriReference(s string) (string, bool) {
	if plainPath(s) {
		return s, true // parses, and is written back as it is
	}
	u, err := url.Parse(s)
	if err != nil {
		return "", false
	}
	return u.String(), true
}

// plainPath reports whether s is a relative reference made of a path of
// unreserved characters and slashes alone, not starting with two slashes:
// url.Parse takes it, and its String gives s back.
func plainPath(s string) bool {
	if s == "" || strings.HasPrefix(s, "//") {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case c == '-', c == '.', c == '_', c == '~', c == '/':
		default:
			return false
		}
	}
	return true
}
