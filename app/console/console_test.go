package console_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jmoiron/sqlx"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/migrate"
	"github.com/effectively-once/effectively/framework/postgres"
	"github.com/effectively-once/effectively/framework/sqlite"
	"github.com/effectively-once/effectively/internal/testenv"
)

const (
	writeSecret = "w-0123456789abcdef-secret"
	readSecret  = "r-0123456789abcdef-secret"
)

// store is what the console reads and acts on.
type store interface {
	driver.Store
	driver.Inspector
}

// bundle is one test's console on a fresh store.
type bundle struct {
	store  store
	server *httptest.Server
	// console is the console under test; db its store's database.
	console *console.Console
	db      *sqlx.DB
	// now is the console's clock.
	now time.Time
}

// setup serves a console with the tokens alice (write) and bob (read) on
// a migrated SQLite store; cfg's other fields are kept.
func setup(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	db := testenv.SQLite(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	s, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	b := setupOn(t, cfg, s)
	b.db = db
	return b
}

// setupPostgres is setup on a PostgreSQL store, in a schema of the
// test's own.
func setupPostgres(t *testing.T, cfg console.Config) *bundle {
	t.Helper()
	db := testenv.Postgres(t)
	require.NoError(t, migrate.Up(context.Background(), db, migrate.Config{}))
	s, err := postgres.NewStore(db, postgres.StoreConfig{})
	require.NoError(t, err)
	b := setupOn(t, cfg, s)
	b.db = db
	return b
}

// setupOn is setup on the store s.
func setupOn(t *testing.T, cfg console.Config, s store) *bundle {
	t.Helper()
	b := &bundle{store: s, now: time.Now()}
	tokens, err := console.ParseTokens([]string{"alice:" + writeSecret + ":write", "bob:" + readSecret + ":read"})
	require.NoError(t, err)
	cfg.Store, cfg.Inspector, cfg.Tokens = s, s, tokens
	cfg.Now = func() time.Time { return b.now }
	c, err := console.New(cfg)
	require.NoError(t, err)
	b.console = c
	t.Cleanup(c.Close)
	b.server = httptest.NewServer(c)
	t.Cleanup(b.server.Close)
	return b
}

// deadLetter stores a dead letter of consumer with code and returns its
// id.
func (b *bundle) deadLetter(t *testing.T, consumer, id string, code framework.Code, body []byte, md map[string]string) int64 {
	t.Helper()
	ctx := context.Background()
	require.NoError(t, b.store.PublishDeadLetter(ctx, driver.DeadLetter{
		Consumer: consumer, Topic: "widgets.widget.added", Source: "widgets", EventID: id,
		Type: "widgets.widget.added", Version: 1, Code: code, Attempts: 3, Body: body, Metadata: md,
	}))
	dls, err := b.store.DeadLetters(ctx, driver.DeadLetterFilter{Consumer: consumer, Source: "widgets", EventID: id})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	return dls[0].ID
}

// client does not follow redirects: the tests look at them.
var client = &http.Client{
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	Timeout:       30 * time.Second,
}

// reply is what the tests look at of a response besides its status and
// body.
type reply struct {
	Header  http.Header
	cookies []*http.Cookie
}

// Cookies returns the cookies the response sets.
func (r reply) Cookies() []*http.Cookie { return r.cookies }

// do sends a request with headers (pairs of name and value) and returns
// the status, the body and the rest of the response.
func (b *bundle) do(t *testing.T, method, path string, form url.Values, headers ...string) (int, string, reply) {
	t.Helper()
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, b.server.URL+path, body)
	require.NoError(t, err)
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(raw), reply{Header: resp.Header, cookies: resp.Cookies()}
}

func bearer(secret string) []string { return []string{"Authorization", "Bearer " + secret} }

// login logs in with secret and returns the cookie header to send.
func (b *bundle) login(t *testing.T, secret string) (string, *http.Cookie) {
	t.Helper()
	code, _, resp := b.do(t, http.MethodPost, "/console/login", url.Values{"token": {secret}, "next": {"/console/consumers"}},
		"Origin", b.server.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/consumers", resp.Header.Get("Location"))
	cookies := resp.Cookies()
	require.Len(t, cookies, 1)
	return cookies[0].Name + "=" + cookies[0].Value, cookies[0]
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// csrf returns the CSRF token of the forms of the page at path.
func (b *bundle) csrf(t *testing.T, cookie, path string) string {
	t.Helper()
	code, page, _ := b.do(t, http.MethodGet, path, nil, "Cookie", cookie)
	require.Equal(t, http.StatusOK, code)
	m := csrfRE.FindStringSubmatch(page)
	require.NotNil(t, m, "a CSRF token in the forms of %s", path)
	return m[1]
}

func TestParseTokens(t *testing.T) {
	t.Parallel()
	tokens, err := console.ParseTokens([]string{"alice:" + writeSecret + ":write", " bob:with:colons:0123456789:read "})
	require.NoError(t, err)
	require.Equal(t, []console.Token{
		{Name: "alice", Secret: writeSecret, Permission: console.Write},
		{Name: "bob", Secret: "with:colons:0123456789", Permission: console.Read},
	}, tokens)

	for _, tc := range []struct{ entry, want string }{
		{"alice", "want name:secret:read or name:secret:write"},
		{"alice:" + writeSecret, "want name:secret:read or name:secret:write"},
		{"alice:" + writeSecret + ":admin", `permission: want read or write, got "admin"`},
		{"al ice:" + writeSecret + ":read", `name "al ice"`},
		{"alice:short-one:read", "secret of alice: want at least 16 characters"},
		{"alice:0123456789abcdef ghi:read", "secret of alice: want printable ASCII"},
	} {
		_, err := console.ParseTokens([]string{tc.entry})
		require.ErrorContains(t, err, "token 1: "+tc.want, tc.entry)
		if strings.Count(tc.entry, ":") == 2 {
			secret := strings.Split(tc.entry, ":")[1]
			require.NotContains(t, err.Error(), secret, "an error never quotes the secret")
		}
	}
	_, err = console.ParseTokens([]string{"alice:" + writeSecret + ":write", "alice:" + readSecret + ":read", "carol:" + writeSecret + ":read"})
	require.ErrorContains(t, err, "token 2: name alice is taken by an earlier token")
	require.ErrorContains(t, err, "token 3 (carol): its secret is an earlier token's")
	require.NotContains(t, err.Error(), writeSecret)
}

func TestNewRefusesMissingParts(t *testing.T) {
	t.Parallel()
	_, err := console.New(console.Config{})
	require.ErrorIs(t, err, console.ErrMissingStore)
	db := testenv.SQLite(t)
	store, err := sqlite.NewStore(db, sqlite.StoreConfig{})
	require.NoError(t, err)
	_, err = console.New(console.Config{Store: store, Inspector: store})
	require.ErrorIs(t, err, console.ErrNoTokens)
	tokens, err := console.ParseTokens([]string{"alice:" + writeSecret + ":write"})
	require.NoError(t, err)
	_, err = console.New(console.Config{Store: store, Inspector: store, Tokens: tokens, TrustedOrigins: []string{"https://ops.example.com/path"}})
	require.ErrorContains(t, err, "TrustedOrigins: want scheme://host[:port]")
}

// TestAccess: every page needs a token, in the Authorization header or
// the login cookie; an unknown one is refused.
func TestAccess(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
	for _, path := range []string{"/console/dead-letters", "/console/dead-letters/1", "/console/events?source=widgets&id=w-1", "/console/consumers"} {
		code, page, _ := b.do(t, http.MethodGet, path, nil)
		require.Equal(t, http.StatusUnauthorized, code, path)
		require.Contains(t, page, `id="login"`, "the login form instead of %s", path)
		require.NotContains(t, page, "gear_refused")

		code, _, _ = b.do(t, http.MethodGet, path, nil, bearer("not-a-token-0123456789")...)
		require.Equal(t, http.StatusUnauthorized, code, path)
		code, _, _ = b.do(t, http.MethodGet, path, nil, "Authorization", "Basic "+readSecret)
		require.Equal(t, http.StatusUnauthorized, code, path)
		code, _, _ = b.do(t, http.MethodGet, path, nil, "Cookie", "effectively_console=YWxpY2U.99999999999.forged")
		require.Equal(t, http.StatusUnauthorized, code, path)

		code, _, _ = b.do(t, http.MethodGet, path, nil, "Authorization", "Bearer"+readSecret)
		require.Equal(t, http.StatusUnauthorized, code, path)
		code, _, _ = b.do(t, http.MethodGet, path, nil, "Authorization", "bearer "+readSecret)
		require.Equal(t, http.StatusOK, code, "%s: the scheme is case-insensitive", path)

		code, page, _ = b.do(t, http.MethodGet, path, nil, bearer(readSecret)...)
		require.Equal(t, http.StatusOK, code, path)
		require.Contains(t, page, `id="operator">bob (read only)`)
	}
	code, _, resp := b.do(t, http.MethodGet, "/console/", nil)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, "/console/dead-letters", resp.Header.Get("Location"))
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
}

// TestMethodsAndChallenge: a page asked for with a method it does not
// serve is a 405 naming the methods it does, an unknown page a 404 (not
// a 405 because the catch-all serves every method), and a 401 carries
// its challenge.
func TestMethodsAndChallenge(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	for _, c := range []struct{ method, path, allow string }{
		{http.MethodPut, "/console/dead-letters", "GET, HEAD"},
		{http.MethodPost, "/console/consumers", "GET, HEAD"},
		{http.MethodDelete, "/console/dead-letters/1/replay", "POST"},
		{http.MethodGet, "/console/dead-letters/1/discard", "POST"},
		{http.MethodPatch, "/console/login", "GET, HEAD, POST"},
	} {
		var form url.Values
		if c.method == http.MethodPost {
			form = url.Values{} // a POST's body is checked before its route
		}
		code, _, resp := b.do(t, c.method, c.path, form, bearer(writeSecret)...)
		require.Equal(t, http.StatusMethodNotAllowed, code, "%s %s", c.method, c.path)
		require.Equal(t, c.allow, resp.Header.Get("Allow"), "%s %s", c.method, c.path)
	}
	for _, m := range []string{http.MethodGet, http.MethodPut} {
		code, _, resp := b.do(t, m, "/console/no-such-page", nil, bearer(writeSecret)...)
		require.Equal(t, http.StatusNotFound, code, m)
		require.Empty(t, resp.Header.Get("Allow"), m)
	}
	code, _, resp := b.do(t, http.MethodGet, "/console/dead-letters", nil)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, `Bearer realm="effectively console"`, resp.Header.Get("WWW-Authenticate"))
	code, _, resp = b.do(t, http.MethodPost, "/console/login", url.Values{"token": {"not-a-token-0123456789"}},
		"Origin", b.server.URL, "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusUnauthorized, code)
	require.Equal(t, `Bearer realm="effectively console"`, resp.Header.Get("WWW-Authenticate"))
}

// TestLogin: the login form sets an HttpOnly, SameSite=Strict cookie,
// which lets the browser in until it expires; a wrong secret or a
// forged cookie does not.
func TestLogin(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{SessionLifetime: time.Hour})

	code, page, resp := b.do(t, http.MethodPost, "/console/login", url.Values{"token": {"wrong-0123456789abcdef"}}, "Origin", b.server.URL)
	require.Equal(t, http.StatusUnauthorized, code)
	require.Contains(t, page, "unknown token")
	require.Empty(t, resp.Cookies())

	cookie, ck := b.login(t, readSecret)
	require.True(t, ck.HttpOnly)
	require.Equal(t, http.SameSiteStrictMode, ck.SameSite)
	require.Equal(t, "/console/", ck.Path)
	require.NotContains(t, ck.Value, readSecret, "the cookie is signed with the secret, not the secret")
	code, page, _ = b.do(t, http.MethodGet, "/console/consumers", nil, "Cookie", cookie)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="operator">bob (read only)`)

	// A cookie of bob's made to say alice, with bob's signature, fails.
	parts := strings.Split(strings.TrimPrefix(cookie, "effectively_console="), ".")
	forged := "effectively_console=YWxpY2U." + parts[1] + "." + parts[2]
	code, _, _ = b.do(t, http.MethodGet, "/console/consumers", nil, "Cookie", forged)
	require.Equal(t, http.StatusUnauthorized, code)

	b.now = b.now.Add(time.Hour)
	code, _, _ = b.do(t, http.MethodGet, "/console/consumers", nil, "Cookie", cookie)
	require.Equal(t, http.StatusUnauthorized, code, "the login expired")

	// A login is never sent elsewhere.
	_, _, resp = b.do(t, http.MethodPost, "/console/login", url.Values{"token": {readSecret}, "next": {"//evil.example/console/"}}, "Origin", b.server.URL)
	require.Equal(t, "/console/dead-letters", resp.Header.Get("Location"))
	// Nor outside the console once the redirect cleans the path.
	for _, next := range []string{"/console/../metrics", "/console/%2e%2e/x", "/console/dead-letters\t", "/console//evil.example"} {
		_, _, resp = b.do(t, http.MethodPost, "/console/login", url.Values{"token": {readSecret}, "next": {strings.ReplaceAll(next, "\\t", "\t")}}, "Origin", b.server.URL)
		require.Equal(t, "/console/dead-letters", resp.Header.Get("Location"), next)
	}
	_, _, resp = b.do(t, http.MethodPost, "/console/login", url.Values{"token": {readSecret}, "next": {"/console/dead-letters?code=x"}}, "Origin", b.server.URL)
	require.Equal(t, "/console/dead-letters?code=x", resp.Header.Get("Location"), "a page of the console is kept, its query too")
}

// TestFormBodies: a POST is a small URL-encoded form. A multipart body is
// refused before it is read: one sent with a wrong token was parsed into
// temporary files that were never deleted, so that anyone could fill the
// disk. A form over its bound is refused as too large.
func TestFormBodies(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
	before, err := filepath.Glob(filepath.Join(os.TempDir(), "multipart-*"))
	require.NoError(t, err)

	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, err := mw.CreateFormFile("f", "big.bin")
	require.NoError(t, err)
	_, err = fw.Write(bytes.Repeat([]byte("x"), 20<<20))
	require.NoError(t, err)
	require.NoError(t, mw.WriteField("token", "wrong-0123456789abcdef"))
	require.NoError(t, mw.Close())
	for _, path := range []string{"/console/login", "/console/dead-letters/" + itoa(id) + "/replay"} {
		req, err := http.NewRequest(http.MethodPost, b.server.URL+path, bytes.NewReader(body.Bytes()))
		require.NoError(t, err)
		req.Header.Set("Content-Type", mw.FormDataContentType())
		req.Header.Set("Origin", b.server.URL)
		resp, err := client.Do(req)
		require.NoError(t, err)
		require.NoError(t, resp.Body.Close())
		require.Equal(t, http.StatusUnsupportedMediaType, resp.StatusCode, path)
	}
	after, err := filepath.Glob(filepath.Join(os.TempDir(), "multipart-*"))
	require.NoError(t, err)
	require.ElementsMatch(t, before, after, "no upload left on the disk")

	code, _, _ := b.do(t, http.MethodPost, "/console/dead-letters/"+itoa(id)+"/replay",
		url.Values{"reason": {strings.Repeat("x", 3<<20)}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusRequestEntityTooLarge, code)
}

// TestDoneMatchesStatus: the notice of what an operator just did shows
// only when the dead letter's status says it: a link with ?done=replayed
// to a pending dead letter showed "Replayed".
func TestDoneMatchesStatus(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
	for _, done := range []string{"replayed", "discarded"} {
		code, page, _ := b.do(t, http.MethodGet, "/console/dead-letters/"+itoa(id)+"?done="+done, nil, bearer(readSecret)...)
		require.Equal(t, http.StatusOK, code)
		require.NotContains(t, page, `class="flash ok"`, done)
	}
}

// TestReplay: a write token replays a pending dead letter with a reason:
// the history records its name and the reason, and the store holds the
// replay for the relay; a read token and a request without a reason are
// refused and change nothing; a second replay is refused. On SQLite and
// PostgreSQL.
func TestReplay(t *testing.T) {
	t.Parallel()
	t.Run("SQLite", func(t *testing.T) {
		t.Parallel()
		testReplay(t, setup(t, console.Config{}))
	})
	t.Run("Postgres", func(t *testing.T) {
		t.Parallel()
		testReplay(t, setupPostgres(t, console.Config{}))
	})
}

func testReplay(t *testing.T, b *bundle) {
	ctx := context.Background()
	id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{"id":"w-1"}`), nil)
	path := "/console/dead-letters/" + itoa(id)

	code, page, _ := b.do(t, http.MethodGet, path, nil, bearer(readSecret)...)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="read-only"`)
	require.NotContains(t, page, `id="replay"`, "no replay form for a read token")

	code, page, _ = b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"fixed"}}, bearer(readSecret)...)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, page, "token bob may read only")
	code, _, _ = b.do(t, http.MethodPost, path+"/discard", url.Values{"reason": {"junk"}}, bearer(readSecret)...)
	require.Equal(t, http.StatusForbidden, code)

	code, page, _ = b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"  "}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, page, "Say why in the reason")
	dl, err := b.store.DeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterPending, dl.Status, "nothing changed")

	code, _, resp := b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"the gear supplier is back"}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusSeeOther, code)
	require.Equal(t, path+"?done=replayed", resp.Header.Get("Location"))
	dl, err = b.store.DeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterReplayed, dl.Status)
	require.Equal(t, "alice", dl.Resolution.By)
	require.Equal(t, "the gear supplier is back", dl.Resolution.Reason)
	history, err := b.store.DeadLetterHistory(ctx, id)
	require.NoError(t, err)
	require.Len(t, history, 2)
	require.Equal(t, driver.HistoryReplayed, history[1].Kind)
	require.Equal(t, "alice", history[1].By)
	replays, err := b.store.ClaimReplays(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Len(t, replays, 1, "the replay waits for the relay")
	require.Equal(t, id, replays[0].DeadLetterID)

	code, page, _ = b.do(t, http.MethodGet, path+"?done=replayed", nil, bearer(readSecret)...)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="done"`)
	require.Regexp(t, `class="history-replayed">\s*<td>[^<]+</td>\s*<td>replayed</td>\s*<td>by <strong>alice</strong>: the gear supplier is back</td>`, page)

	code, page, _ = b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"again"}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, page, "it is not pending any more")
	replays, err = b.store.ClaimReplays(ctx, 10, time.Minute)
	require.NoError(t, err)
	require.Empty(t, replays, "replayed once")
}

// TestRefuseReplay: the service's refusal (an undeclared consumer, a dead
// letter older than the retention) hides the replay form and refuses the
// POST; discard still works.
func TestRefuseReplay(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{RefuseReplay: func(dl driver.DeadLetter, _ time.Time) string {
		return "consumer " + dl.Consumer + " is not declared in this service"
	}})
	id := b.deadLetter(t, "widgets.old", "w-1", "gear_refused", []byte(`{}`), nil)
	path := "/console/dead-letters/" + itoa(id)
	_, page, _ := b.do(t, http.MethodGet, path, nil, bearer(writeSecret)...)
	require.Contains(t, page, "consumer widgets.old is not declared in this service")
	require.NotContains(t, page, `id="replay"`)
	code, page, _ := b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"try"}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, page, "Not replayed: consumer widgets.old is not declared")

	code, _, _ = b.do(t, http.MethodPost, path+"/discard", url.Values{"reason": {"the consumer is gone"}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusSeeOther, code)
	dl, err := b.store.DeadLetter(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterDiscarded, dl.Status)
	require.Equal(t, "alice", dl.Resolution.By)
}

// TestCrossOrigin: a POST that another site may have sent is refused, as
// is a cookie POST without the form's CSRF token; the same POST from the
// console's own page goes through.
func TestCrossOrigin(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{TrustedOrigins: []string{"https://ops.example.com"}})
	ctx := context.Background()
	id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
	path := "/console/dead-letters/" + itoa(id)
	cookie, _ := b.login(t, writeSecret)
	csrf := b.csrf(t, cookie, path)
	form := url.Values{"reason": {"fixed"}, "csrf": {csrf}}

	for _, tc := range []struct {
		name    string
		headers []string
		want    string
	}{
		{"OtherOrigin", []string{"Origin", "https://evil.example"}, `Origin &#34;https://evil.example&#34; is not this console&#39;s`},
		{"NullOrigin", []string{"Origin", "null"}, "is not this console"},
		{"CrossSite", []string{"Sec-Fetch-Site", "cross-site", "Origin", b.server.URL}, "Sec-Fetch-Site is cross-site"},
		{"SameSite", []string{"Sec-Fetch-Site", "same-site"}, "Sec-Fetch-Site is same-site"},
		{"NoOriginWithCookie", nil, "a form POST without Origin"},
	} {
		code, page, _ := b.do(t, http.MethodPost, path+"/replay", form, append([]string{"Cookie", cookie}, tc.headers...)...)
		require.Equal(t, http.StatusForbidden, code, tc.name)
		require.Contains(t, page, tc.want, tc.name)
	}
	code, _, _ := b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"fixed"}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusForbidden, code, "without the CSRF token")
	code, _, _ = b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"fixed"}, "csrf": {"AAAA"}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusForbidden, code, "with a wrong CSRF token")
	code, _, _ = b.do(t, http.MethodPost, path+"/replay", url.Values{"reason": {"fixed"}}, append(bearer(writeSecret), "Origin", "https://evil.example")...)
	require.Equal(t, http.StatusForbidden, code, "a bearer POST is checked too")
	code, _, _ = b.do(t, http.MethodPost, "/console/login", url.Values{"token": {writeSecret}}, "Origin", "https://evil.example")
	require.Equal(t, http.StatusForbidden, code, "a login from another site")

	dl, err := b.store.DeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterPending, dl.Status, "nothing refused changed the dead letter")

	code, _, _ = b.do(t, http.MethodPost, path+"/replay", form, "Cookie", cookie, "Origin", "https://ops.example.com", "Sec-Fetch-Site", "same-origin")
	require.Equal(t, http.StatusSeeOther, code, "from a trusted origin")
	dl, err = b.store.DeadLetter(ctx, id)
	require.NoError(t, err)
	require.Equal(t, driver.DeadLetterReplayed, dl.Status)
}

// TestLogout: logging out clears the cookie.
func TestLogout(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	cookie, _ := b.login(t, readSecret)
	csrf := b.csrf(t, cookie, "/console/consumers")
	code, _, resp := b.do(t, http.MethodPost, "/console/logout", url.Values{"csrf": {csrf}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusSeeOther, code)
	require.Len(t, resp.Cookies(), 1)
	require.Negative(t, resp.Cookies()[0].MaxAge)
}

// TestEscaping: a body with HTML, NUL, bytes that are not UTF-8 and a
// bidirectional override, and metadata with HTML, show as text: every
// byte visible, nothing interpreted, the page valid UTF-8.
func TestEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	body := []byte("<script>alert(1)</script>\x00\xff\xfe\u202e</pre><img src=x onerror=alert(2)>")
	id := b.deadLetter(t, "widgets.count", "<b>w-1</b>", "malformed_envelope", body, map[string]string{"<i>key</i>": `"><script>alert(3)</script>`})

	for _, path := range []string{"/console/dead-letters/" + itoa(id), "/console/dead-letters?consumer=widgets.count", "/console/events?source=widgets&id=%3Cb%3Ew-1%3C%2Fb%3E"} {
		code, page, _ := b.do(t, http.MethodGet, path, nil, bearer(readSecret)...)
		require.Equal(t, http.StatusOK, code, path)
		require.True(t, utf8.ValidString(page), "%s is valid UTF-8", path)
		require.NotContains(t, page, "\x00", path)
		require.NotContains(t, page, "<b>w-1", path)
		require.Contains(t, page, "&lt;b&gt;w-1&lt;/b&gt;", path)
	}
	_, page, _ := b.do(t, http.MethodGet, "/console/dead-letters/"+itoa(id), nil, bearer(readSecret)...)
	require.NotContains(t, page, "<script>alert")
	require.NotContains(t, page, "<img")
	require.NotContains(t, page, "\u202e")
	require.Contains(t, page, `&lt;script&gt;alert(1)&lt;/script&gt;\x00\xff\xfe\u202e&lt;/pre&gt;&lt;img src=x onerror=alert(2)&gt;`)
	require.Contains(t, page, "bytes that are not UTF-8")
	require.Contains(t, page, "&lt;i&gt;key&lt;/i&gt;")
	require.Contains(t, page, "&#34;&gt;&lt;script&gt;alert(3)&lt;/script&gt;")
}

// TestResolvedByEscaped: who resolved a dead letter is the command
// line's --by, free text like the reason: the Resolved line shows a
// bidirectional override or an escape in it as an escape, as the history
// does, not as itself (which turned the rest of the line around).
func TestResolvedByEscaped(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	id := b.deadLetter(t, "widgets.count", "w-1", "invalid_payload", []byte(`{}`), nil)
	_, err := b.store.ResolveDeadLetter(context.Background(), id, driver.Resolution{
		Status: driver.DeadLetterDiscarded, By: "mallory\u202e\x1b[2J", Reason: "test data",
	})
	require.NoError(t, err)
	code, page, _ := b.do(t, http.MethodGet, "/console/dead-letters/"+itoa(id), nil, bearer(readSecret)...)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, page, "\u202e")
	require.NotContains(t, page, "\x1b")
	require.Regexp(t, `<dt>Resolved</dt><dd>discarded by mallory\\u202e\\x1b\[2J at `, page)
}

// TestBodyIndented: a JSON body is shown indented.
func TestBodyIndented(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	id := b.deadLetter(t, "widgets.count", "w-1", "invalid_payload", []byte(`{"specversion":"1.0","data":{"name":"gear"}}`), map[string]string{"received": "1"})
	_, page, _ := b.do(t, http.MethodGet, "/console/dead-letters/"+itoa(id), nil, bearer(readSecret)...)
	require.Contains(t, page, "{\n  &#34;specversion&#34;: &#34;1.0&#34;,\n  &#34;data&#34;: {\n    &#34;name&#34;: &#34;gear&#34;\n  }\n}")
	require.Contains(t, page, "Body: JSON, 44 bytes")
	require.Regexp(t, `<td class="mono">received</td><td class="mono">1</td>`, page)
}

// TestCounts: the list counts pending dead letters by consumer and code,
// and lists those of the selected consumer and code.
func TestCounts(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	for i, c := range []struct {
		consumer string
		code     framework.Code
	}{
		{"widgets.count", "gear_refused"},
		{"widgets.count", "gear_refused"},
		{"widgets.count", "timeout"},
		{"widgets.audit", "gear_refused"},
	} {
		b.deadLetter(t, c.consumer, "w-"+itoa(int64(i)), c.code, []byte(`{}`), nil)
	}
	_, err := b.store.ResolveDeadLetter(context.Background(), 4, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "x", Reason: "y"})
	require.NoError(t, err)

	row := func(page, consumer, code string, n int) {
		t.Helper()
		require.Regexp(t, `>`+regexp.QuoteMeta(consumer)+`</a></td>\s*<td><code>`+code+`</code></td>\s*<td class="num">`+itoa(int64(n))+`</td>`, page)
	}
	_, page, _ := b.do(t, http.MethodGet, "/console/dead-letters", nil, bearer(readSecret)...)
	row(page, "widgets.count", "gear_refused", 2)
	row(page, "widgets.count", "timeout", 1)
	require.NotContains(t, page, "widgets.audit", "its only dead letter is discarded")
	require.Contains(t, page, `id="total">3<`)

	_, page, _ = b.do(t, http.MethodGet, "/console/dead-letters?status=all", nil, bearer(readSecret)...)
	row(page, "widgets.audit", "gear_refused", 1)

	_, page, _ = b.do(t, http.MethodGet, "/console/dead-letters?consumer=widgets.count&code=gear_refused", nil, bearer(readSecret)...)
	require.Contains(t, page, `href="/console/dead-letters/1"`)
	require.Contains(t, page, `href="/console/dead-letters/2"`)
	require.NotContains(t, page, `href="/console/dead-letters/3"`, "another code")

	code, _, _ := b.do(t, http.MethodGet, "/console/dead-letters?status=lost", nil, bearer(readSecret)...)
	require.Equal(t, http.StatusBadRequest, code)
}

// bodyCounter is a store that counts the bytes of the bodies its
// DeadLetters returns.
type bodyCounter struct {
	store
	bodyBytes int
}

func (b *bodyCounter) DeadLetters(ctx context.Context, f driver.DeadLetterFilter) ([]driver.DeadLetter, error) {
	dls, err := b.store.DeadLetters(ctx, f)
	for _, dl := range dls {
		b.bodyBytes += len(dl.Body)
	}
	return dls, err
}

// TestListReadsNoBody: the list of dead letters, which shows no message,
// reads none. Its counts read up to 10,000 dead letters 500 at a time,
// each with its body: 1,500 dead letters of 1 MB (too_large) made one
// view of the list read 1.5 GB and hold 500 MB at once, and four views
// at once took the service to 3.3 GB, on a read-only token.
func TestListReadsNoBody(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T, console.Config) *bundle{"SQLite": setup, "Postgres": setupPostgres} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			counter := &bodyCounter{store: open(t, console.Config{}).store}
			b := setupOn(t, console.Config{}, counter)
			body := []byte(`{"data":"` + strings.Repeat("x", 64<<10) + `"}`)
			var id int64
			for i := range 3 {
				id = b.deadLetter(t, "widgets.count", "w-"+itoa(int64(i)), "too_large", body, nil)
			}
			counter.bodyBytes = 0

			code, page, _ := b.do(t, http.MethodGet, "/console/dead-letters?consumer=widgets.count&code=too_large", nil, bearer(readSecret)...)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, page, `id="total">3<`)
			require.Contains(t, page, `href="/console/dead-letters/`+itoa(id)+`"`)
			require.Zero(t, counter.bodyBytes, "the counts and the list read the messages' bodies")

			_, page, _ = b.do(t, http.MethodGet, "/console/dead-letters/"+itoa(id), nil, bearer(readSecret)...)
			require.Contains(t, page, "Body: JSON, "+itoa(int64(len(body)))+" bytes", "the dead letter's own page shows its body")
		})
	}
}

// manyDeadLetters is a store whose DeadLetters lists n pending dead
// letters of one consumer and code, ids 1 to n, made up as asked.
type manyDeadLetters struct {
	store
	n int64
}

func (m manyDeadLetters) DeadLetters(_ context.Context, f driver.DeadLetterFilter) ([]driver.DeadLetter, error) {
	var dls []driver.DeadLetter
	for id := f.AfterID + 1; id <= m.n && len(dls) < f.Limit; id++ {
		dls = append(dls, driver.DeadLetter{ID: id, Consumer: "widgets.count", Code: "timeout", Status: driver.DeadLetterPending})
	}
	return dls, nil
}

// TestCountsPartial: the counts stop at 10,000 dead letters and say so
// only when there are more; exactly 10,000 are counted whole.
func TestCountsPartial(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n       int64
		partial bool
	}{{9_999, false}, {10_000, false}, {10_001, true}} {
		t.Run(itoa(tc.n), func(t *testing.T) {
			t.Parallel()
			b := setupOn(t, console.Config{}, manyDeadLetters{store: setup(t, console.Config{}).store, n: tc.n})
			code, page, _ := b.do(t, http.MethodGet, "/console/dead-letters", nil, bearer(readSecret)...)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, page, `id="total">`+itoa(min(tc.n, 10_000))+`<`)
			if tc.partial {
				require.Contains(t, page, "(the first 10000 only)")
			} else {
				require.NotContains(t, page, "the first")
			}
		})
	}
}

// TestEventAndConsumers: the event view shows the event's dead letters
// with their history and names the declared consumers with no record of
// it; the consumers view shows each declared consumer with its figures
// and a name no longer declared that has pending dead letters.
func TestEventAndConsumers(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{Transport: "sqlite", Consumers: []console.Consumer{
		{Name: "widgets.count", Types: []string{"widgets.widget.added"}, Subscription: "sqlite group widgets.count", Concurrency: 4, BatchSize: 8},
		{Name: "widgets.mail", Types: []string{"widgets.widget.added"}, WithoutDedup: "sends mail"},
		{Name: "orders.count", Types: []string{"orders.order.placed"}},
	}})
	id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
	b.deadLetter(t, "widgets.old", "w-2", "timeout", []byte(`{}`), nil)

	_, page, _ := b.do(t, http.MethodGet, "/console/events?source=widgets&id=w-1", nil, bearer(readSecret)...)
	require.Contains(t, page, `<a href="/console/dead-letters/`+itoa(id)+`">Dead letter `+itoa(id)+`</a> of widgets.count`)
	require.Contains(t, page, "<td>failed</td><td>code <code>gear_refused</code>, 3 attempts</td>")
	require.Contains(t, page, "<td>widgets.mail</td><td class=\"muted\">no record: without deduplication it keeps no mark (sends mail)</td>")
	require.NotContains(t, page, "orders.count", "a consumer of another type")
	require.Contains(t, page, "No outbox row: another service produced it")

	_, page, _ = b.do(t, http.MethodGet, "/console/events?source=widgets&id=nope", nil, bearer(readSecret)...)
	require.Contains(t, page, `id="unknown"`)

	_, page, _ = b.do(t, http.MethodGet, "/console/consumers", nil, bearer(readSecret)...)
	require.Regexp(t, `<td>widgets.count</td>\s*<td>widgets.widget.added</td>\s*<td>sqlite group widgets.count</td>\s*<td class="num">4</td>\s*<td class="num">8</td>\s*<td>on</td>\s*<td class="num">0</td>\s*<td class="num"><a href="/console/dead-letters\?consumer=widgets.count">1</a></td>`, page)
	require.Regexp(t, `<td>widgets.mail</td>\s*<td>widgets.widget.added</td>\s*<td>sqlite</td>`, page)
	require.Regexp(t, `<td>widgets.old</td>\s*<td class="muted" colspan="5">not declared`, page)
	require.Contains(t, page, "Outbox: no unsent row.")
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// TestReasonNotText: a reason that no store can record (NUL, bytes that
// are not UTF-8) is refused with a 400 that says so, on every store, and
// changes nothing. PostgreSQL failed the transaction, which the console
// answered with a 500; SQLite stored the NUL.
func TestReasonNotText(t *testing.T) {
	t.Parallel()
	for name, open := range map[string]func(*testing.T, console.Config) *bundle{"SQLite": setup, "Postgres": setupPostgres} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t, console.Config{})
			id := b.deadLetter(t, "widgets.count", "w-1", "gear_refused", []byte(`{}`), nil)
			path := "/console/dead-letters/" + itoa(id)
			for _, action := range []string{"replay", "discard"} {
				for _, reason := range []string{"fixed\x00", "fixed \xff"} {
					code, page, _ := b.do(t, http.MethodPost, path+"/"+action, url.Values{"reason": {reason}}, bearer(writeSecret)...)
					require.Equal(t, http.StatusBadRequest, code, "%s %q", action, reason)
					require.Contains(t, page, "the reason is not valid UTF-8 text, or holds NUL.")
				}
				code, page, _ := b.do(t, http.MethodPost, path+"/"+action,
					url.Values{"reason": {strings.Repeat("fixed ", 1<<20/6)}}, bearer(writeSecret)...)
				require.Equal(t, http.StatusBadRequest, code, "%s, a megabyte of reason", action)
				require.Contains(t, page, "the reason is longer than 4096 bytes.")
			}
			dl, err := b.store.DeadLetter(context.Background(), id)
			require.NoError(t, err)
			require.Equal(t, driver.DeadLetterPending, dl.Status)
		})
	}
}

// unreadable is a store whose DeadLetter fails, as a database that goes
// away for a moment does.
type unreadable struct{ store }

func (unreadable) DeadLetter(context.Context, int64) (driver.DeadLetter, error) {
	return driver.DeadLetter{}, errors.New("connection reset")
}

// TestReplayReadFails: a replay from the console whose read of the dead
// letter fails is refused, not recorded unchecked: the command line's
// refusals (an undeclared consumer here) are checked on that read.
func TestReplayReadFails(t *testing.T) {
	t.Parallel()
	s := unreadable{setup(t, console.Config{}).store}
	b := setupOn(t, console.Config{RefuseReplay: func(dl driver.DeadLetter, _ time.Time) string {
		return "consumer " + dl.Consumer + " is not declared in this service"
	}}, s)
	id := b.deadLetter(t, "widgets.old", "w-1", "gear_refused", []byte(`{}`), nil)
	code, _, _ := b.do(t, http.MethodPost, "/console/dead-letters/"+itoa(id)+"/replay", url.Values{"reason": {"try"}}, bearer(writeSecret)...)
	require.Equal(t, http.StatusInternalServerError, code)
	dls, err := s.store.DeadLetters(context.Background(), driver.DeadLetterFilter{Consumer: "widgets.old"})
	require.NoError(t, err)
	require.Len(t, dls, 1)
	require.Equal(t, driver.DeadLetterPending, dls[0].Status, "the replay was recorded unchecked")
}
