package console

import (
	"crypto/hmac"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Permission says what a token may do.
type Permission int

// The permissions of a token. Every token may read; write adds replay
// and discard.
const (
	Read Permission = iota + 1
	Write
)

// String returns "read" or "write".
func (p Permission) String() string {
	switch p {
	case Read:
		return "read"
	case Write:
		return "write"
	}
	return fmt.Sprintf("Permission(%d)", int(p))
}

// MinSecretLen is the shortest secret a token may have.
const MinSecretLen = 16

// Token is an operator's access to the console: its name is recorded as
// who replays or discards a dead letter.
type Token struct {
	// Name identifies the operator (letters, digits, '.', '_', '@', '-';
	// at most 64).
	Name string
	// Secret is what the operator presents: at least MinSecretLen
	// printable ASCII characters, without spaces or commas.
	Secret string
	// Permission is Read or Write.
	Permission Permission
}

var tokenNameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// ParseToken parses "name:secret:read" or "name:secret:write". The
// secret may hold colons; the name and the permission may not. Errors
// never quote the secret.
func ParseToken(s string) (Token, error) {
	first, last := strings.IndexByte(s, ':'), strings.LastIndexByte(s, ':')
	if first < 0 || first == last {
		return Token{}, errors.New("want name:secret:read or name:secret:write")
	}
	t := Token{Name: s[:first], Secret: s[first+1 : last]}
	switch perm := s[last+1:]; perm {
	case "read":
		t.Permission = Read
	case "write":
		t.Permission = Write
	default:
		return Token{}, fmt.Errorf("permission: want read or write, got %q", perm)
	}
	if !tokenNameRE.MatchString(t.Name) {
		return Token{}, fmt.Errorf("name %q: want letters, digits, '.', '_', '@' or '-', at most 64", t.Name)
	}
	if len(t.Secret) < MinSecretLen {
		return Token{}, fmt.Errorf("secret of %s: want at least %d characters (e.g. openssl rand -hex 24)", t.Name, MinSecretLen)
	}
	for i := 0; i < len(t.Secret); i++ {
		if c := t.Secret[i]; c <= ' ' || c > '~' || c == ',' {
			return Token{}, fmt.Errorf("secret of %s: want printable ASCII without spaces or commas", t.Name)
		}
	}
	return t, nil
}

// ParseTokens parses each of list (see ParseToken) and refuses two tokens
// with one name or one secret. Each error names the entry by its
// position.
func ParseTokens(list []string) ([]Token, error) {
	var (
		tokens  []Token
		errs    []error
		names   = make(map[string]bool)
		secrets = make(map[string]bool)
	)
	for i, s := range list {
		t, err := ParseToken(strings.TrimSpace(s))
		switch {
		case err != nil:
			errs = append(errs, fmt.Errorf("token %d: %w", i+1, err))
			continue
		case names[t.Name]:
			errs = append(errs, fmt.Errorf("token %d: name %s is taken by an earlier token", i+1, t.Name))
		case secrets[t.Secret]:
			errs = append(errs, fmt.Errorf("token %d (%s): its secret is an earlier token's: give each its own", i+1, t.Name))
		}
		names[t.Name], secrets[t.Secret] = true, true
		tokens = append(tokens, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tokens, nil
}

// keyring finds tokens by secret, in constant time, and signs and checks
// the sessions and CSRF tokens of the login cookie with the token's
// secret: a session outlives neither its token nor a change of its
// secret, and every process configured with the token accepts it.
type keyring struct {
	tokens []Token
	byName map[string]Token
}

func newKeyring(tokens []Token) keyring {
	k := keyring{tokens: tokens, byName: make(map[string]Token, len(tokens))}
	for _, t := range tokens {
		k.byName[t.Name] = t
	}
	return k
}

// bySecret returns the token whose secret is secret. It compares the
// digests of secret and of every token's, so that neither the match nor
// the lengths show in the time it takes.
func (k keyring) bySecret(secret string) (Token, bool) {
	given := sha256.Sum256([]byte(secret))
	var (
		found Token
		ok    int
	)
	for _, t := range k.tokens {
		want := sha256.Sum256([]byte(t.Secret))
		if subtle.ConstantTimeCompare(given[:], want[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

// session is an operator logged in with a cookie.
type session struct {
	token   Token
	expires time.Time
}

// mac signs the parts with the secret of t.
func mac(t Token, parts ...string) []byte {
	h := hmac.New(sha256.New, []byte(t.Secret))
	h.Write([]byte(strings.Join(parts, "\x00")))
	return h.Sum(nil)
}

var b64 = base64.RawURLEncoding

// cookieValue returns the cookie of a session of t until expires:
// name.expiry.signature.
func (k keyring) cookieValue(t Token, expires time.Time) string {
	exp := strconv.FormatInt(expires.Unix(), 10)
	return b64.EncodeToString([]byte(t.Name)) + "." + exp + "." + b64.EncodeToString(mac(t, "session", t.Name, exp))
}

// session checks the cookie's value at now.
func (k keyring) session(value string, now time.Time) (session, bool) {
	parts := strings.Split(value, ".")
	if len(parts) != 3 {
		return session{}, false
	}
	name, err := b64.DecodeString(parts[0])
	if err != nil {
		return session{}, false
	}
	t, ok := k.byName[string(name)]
	if !ok {
		return session{}, false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || !now.Before(time.Unix(exp, 0)) {
		return session{}, false
	}
	sig, err := b64.DecodeString(parts[2])
	if err != nil || !hmac.Equal(sig, mac(t, "session", t.Name, parts[1])) {
		return session{}, false
	}
	return session{token: t, expires: time.Unix(exp, 0)}, true
}

// csrf returns the CSRF token of the forms of s.
func (s session) csrf() string {
	return b64.EncodeToString(mac(s.token, "csrf", s.token.Name, strconv.FormatInt(s.expires.Unix(), 10)))
}

// checkCSRF reports whether given is the CSRF token of s.
func (s session) checkCSRF(given string) bool {
	sig, err := b64.DecodeString(given)
	if err != nil {
		return false
	}
	want, _ := b64.DecodeString(s.csrf())
	return hmac.Equal(sig, want)
}

// errCrossOrigin is the error of a POST that another site may have sent.
var errCrossOrigin = errors.New("cross-origin request refused")

// checkOrigin refuses a POST that a browser sent from another site:
// Sec-Fetch-Site, where present, must say same-origin, and Origin, where
// present, must be the console's own (its host is the request's Host) or
// one of trusted. A POST with neither header comes from a program, not a
// browser: it is refused when it relies on the login cookie, which only
// browsers send.
func checkOrigin(r *http.Request, trusted map[string]bool, byCookie bool) error {
	if site := r.Header.Get("Sec-Fetch-Site"); site != "" && site != "same-origin" {
		return fmt.Errorf("%w: Sec-Fetch-Site is %s", errCrossOrigin, site)
	}
	origin := r.Header.Get("Origin")
	if origin == "" {
		if byCookie && r.Header.Get("Sec-Fetch-Site") == "" {
			return fmt.Errorf("%w: a form POST without Origin", errCrossOrigin)
		}
		return nil
	}
	if trusted[strings.ToLower(origin)] {
		return nil
	}
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || !strings.EqualFold(u.Host, r.Host) {
		return fmt.Errorf("%w: Origin %q is not this console's", errCrossOrigin, origin)
	}
	return nil
}
