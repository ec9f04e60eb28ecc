package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/effectively-once/effectively/framework/driver"
)

// Path is where the console is served; its pages are below it.
const Path = "/console/"

// DefaultSessionLifetime is how long a login lasts.
const DefaultSessionLifetime = 12 * time.Hour

// cookieName names the login cookie.
const cookieName = "effectively_console"

// Consumer is a consumer the service declares, as the consumers view and
// the event view show it.
type Consumer struct {
	Name string
	// Types are the event types it receives.
	Types []string
	// Subscription is what the transport names its subscription, e.g.
	// "amqp queue x"; empty when it has none.
	Subscription string
	Concurrency  int
	BatchSize    int
	// WithoutDedup is why it keeps no processed marks; empty when it
	// keeps them.
	WithoutDedup string
}

// Config configures the console.
type Config struct {
	// Store holds the dead letters the console shows and resolves.
	// Required.
	Store driver.Store
	// Inspector answers the event and consumers views; usually the same
	// store. Required.
	Inspector driver.Inspector
	// Tokens give access (see ParseTokens). At least one is required.
	Tokens []Token
	// TrustedOrigins are origins (scheme://host[:port]) that may POST
	// besides the console's own, e.g. a proxy's that rewrites Host.
	// Defaults to none.
	TrustedOrigins []string
	// Consumers are the declared consumers. Defaults to none.
	Consumers []Consumer
	// Transport names the service's transport, for the consumers view.
	Transport string
	// Partitions returns the partitions of a partitioned consumer, for
	// the consumers view: their leases and what waits in them; nil for a
	// consumer that is not partitioned. Defaults to none.
	Partitions func(ctx context.Context, consumer string) (*Partitions, error)
	// Lag returns what waits for a consumer, for the consumers view; nil
	// when unknown. Defaults to none.
	Lag func(ctx context.Context, consumer string) (*Lag, error)
	// RefuseReplay says why a dead letter must not be replayed (its
	// consumer is not declared, it is older than the processed marks'
	// retention), or "" when it may. Defaults to refusing none but those
	// not pending.
	RefuseReplay func(dl driver.DeadLetter, now time.Time) string
	// SessionLifetime is how long a login lasts. Defaults to
	// DefaultSessionLifetime.
	SessionLifetime time.Duration
	// Logger receives a line per replay, discard and refused request.
	// Defaults to discarding.
	Logger *slog.Logger
	// Now is the console's clock. Defaults to time.Now.
	Now func() time.Time
}

// ErrMissingStore is returned by New without a Store or an Inspector.
var ErrMissingStore = errors.New("console: missing Store or Inspector (the service's driver.Store, which implements driver.Inspector)")

// ErrNoTokens is returned by New without a token.
var ErrNoTokens = errors.New("console: no token: give at least one (see ParseTokens)")

// WithDefaults returns a copy of c with zero fields set to their
// defaults.
func (c Config) WithDefaults() Config {
	if c.SessionLifetime == 0 {
		c.SessionLifetime = DefaultSessionLifetime
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.RefuseReplay == nil {
		c.RefuseReplay = func(driver.DeadLetter, time.Time) string { return "" }
	}
	return c
}

// Validate reports the first invalid field of c.
func (c Config) Validate() error {
	switch {
	case c.Store == nil || c.Inspector == nil:
		return ErrMissingStore
	case len(c.Tokens) == 0:
		return ErrNoTokens
	case c.SessionLifetime < 0:
		return errors.New("console: SessionLifetime must not be negative")
	}
	for _, o := range c.TrustedOrigins {
		if err := ValidateOrigin(o); err != nil {
			return fmt.Errorf("console: TrustedOrigins: %w", err)
		}
	}
	return nil
}

// ValidateOrigin accepts an origin as TrustedOrigins holds it:
// scheme://host[:port], nothing more.
func ValidateOrigin(o string) error {
	u, err := url.Parse(o)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.Path != "" || u.RawQuery != "" || u.User != nil {
		return fmt.Errorf("want scheme://host[:port] such as https://ops.example.com, got %q", o)
	}
	return nil
}

// Console is the operator console: an http.Handler to mount at Path.
type Console struct {
	cfg     Config
	keys    keyring
	trusted map[string]bool
	pages   map[string]*template.Template
	mux     *http.ServeMux

	// jobs keeps the bulk jobs; nil when the store keeps none. owner
	// names this console among their runners.
	jobs  driver.BulkJobs
	owner string
	// ctx bounds the bulk jobs this console runs; stop ends it (Close).
	ctx  context.Context
	stop context.CancelFunc
	wg   sync.WaitGroup
	mu   sync.Mutex
	// running cancels each job this console runs, by id.
	running map[int64]context.CancelFunc
}

//go:embed templates
var templates embed.FS

// New returns the console of cfg.
func New(cfg Config) (*Console, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pages, err := parsePages()
	if err != nil {
		return nil, err
	}
	c := &Console{
		cfg: cfg, keys: newKeyring(cfg.Tokens), trusted: make(map[string]bool), pages: pages, mux: http.NewServeMux(),
		owner: newOwner(), running: make(map[int64]context.CancelFunc),
	}
	c.jobs, _ = cfg.Store.(driver.BulkJobs)
	c.ctx, c.stop = context.WithCancel(context.Background())
	for _, o := range cfg.TrustedOrigins {
		c.trusted[strings.ToLower(o)] = true
	}
	c.routes()
	return c, nil
}

// parsePages parses each page with the layout.
func parsePages() (map[string]*template.Template, error) {
	funcs := template.FuncMap{
		"stamp":   stamp,
		"visible": visible,
		"query":   query,
	}
	pages := make(map[string]*template.Template)
	for _, name := range []string{"login", "deadletters", "deadletter", "event", "consumers", "bulk", "bulkjob", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templates, "templates/layout.html", "templates/"+name+".html")
		if err != nil {
			return nil, fmt.Errorf("console: template %s: %w", name, err)
		}
		pages[name] = t
	}
	return pages, nil
}

func (c *Console) routes() {
	c.mux.HandleFunc("GET "+Path+"{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Path+"dead-letters", http.StatusSeeOther)
	})
	c.mux.HandleFunc("GET "+Path+"login", c.loginPage)
	c.mux.HandleFunc("POST "+Path+"login", c.login)
	c.mux.Handle("POST "+Path+"logout", c.authed(Read, c.logout))
	c.mux.Handle("GET "+Path+"dead-letters", c.authed(Read, c.deadLetters))
	c.mux.Handle("GET "+Path+"dead-letters/{id}", c.authed(Read, c.deadLetter))
	c.mux.Handle("POST "+Path+"dead-letters/{id}/replay", c.authed(Write, c.resolve(driver.DeadLetterReplayed)))
	c.mux.Handle("POST "+Path+"dead-letters/{id}/discard", c.authed(Write, c.resolve(driver.DeadLetterDiscarded)))
	c.mux.Handle("GET "+Path+"bulk", c.authed(Read, c.bulkPage))
	c.mux.Handle("POST "+Path+"bulk/preview", c.authed(Write, c.bulkPreview))
	c.mux.Handle("POST "+Path+"bulk", c.authed(Write, c.bulkStart))
	c.mux.Handle("GET "+Path+"bulk/{id}", c.authed(Read, c.bulkJob))
	c.mux.Handle("POST "+Path+"bulk/{id}/cancel", c.authed(Write, c.bulkCancel))
	c.mux.Handle("POST "+Path+"bulk/{id}/resume", c.authed(Write, c.bulkResume))
	c.mux.Handle("GET "+Path+"events", c.authed(Read, c.event))
	c.mux.Handle("GET "+Path+"consumers", c.authed(Read, c.consumers))
	c.mux.HandleFunc(Path, func(w http.ResponseWriter, r *http.Request) {
		if allowed := c.allowedMethods(r); len(allowed) > 0 {
			w.Header().Set("Allow", strings.Join(allowed, ", "))
			c.fail(w, r, nil, http.StatusMethodNotAllowed, r.Method+" is not allowed here")
			return
		}
		c.fail(w, r, nil, http.StatusNotFound, "no such page")
	})
}

// allowedMethods returns the methods of the routes that serve r's path,
// for the Allow header of a 405: none when no route does.
func (c *Console) allowedMethods(r *http.Request) []string {
	var allowed []string
	for _, m := range []string{http.MethodGet, http.MethodPost} {
		probe := r.Clone(r.Context())
		probe.Method = m
		if _, pattern := c.mux.Handler(probe); pattern != "" && pattern != Path {
			allowed = append(allowed, m)
			if m == http.MethodGet {
				allowed = append(allowed, http.MethodHead) // ServeMux serves HEAD by GET's route
			}
		}
	}
	return allowed
}

// unauthorized answers 401 with the login form of data, and the
// WWW-Authenticate challenge a 401 carries: a bearer token (or the form's
// cookie).
func (c *Console) unauthorized(w http.ResponseWriter, r *http.Request, data loginData) {
	w.Header().Set("WWW-Authenticate", `Bearer realm="effectively console"`)
	c.render(w, r, http.StatusUnauthorized, "login", data)
}

// ServeHTTP serves the console's pages below Path, with headers that keep
// them out of frames and caches and allow only their own inline style
// and script.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	nonce := newNonce()
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'nonce-"+nonce+"'; script-src 'nonce-"+nonce+
		"'; img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// Not no-referrer, under which browsers send "Origin: null" with the
	// forms, and checkOrigin refuses them.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	if r.Method == http.MethodPost {
		// The console's forms are small and URL-encoded. A multipart body
		// was parsed into temporary files, which a request refused for its
		// token left on the disk, so that anyone could fill it.
		if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
			http.Error(w, "a console form is sent as application/x-www-form-urlencoded", http.StatusUnsupportedMediaType)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			if _, tooLarge := errors.AsType[*http.MaxBytesError](err); tooLarge {
				http.Error(w, fmt.Sprintf("a console form is at most %d bytes", maxFormBytes), http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "the form does not parse", http.StatusBadRequest)
			return
		}
	}
	c.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), nonceKey{}, nonce)))
}

// maxFormBytes bounds the body of a console form, read into memory: far
// above a reason of at most 4096 bytes, escaped, so that a reason too long
// is told as such.
const maxFormBytes = 2 << 20

type nonceKey struct{}

func newNonce() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return b64.EncodeToString(b)
}

// operator is who a request comes from.
type operator struct {
	token Token
	// session is the login, nil when the request carries the token in
	// its Authorization header.
	session *session
}

type operatorKey struct{}

// identify returns who r comes from: the token of its Authorization
// header (Bearer), else of its login cookie.
func (c *Console) identify(r *http.Request) (operator, bool) {
	if h := r.Header.Get("Authorization"); h != "" {
		// The scheme is case-insensitive (RFC 9110, section 11.1).
		scheme, secret, ok := strings.Cut(h, " ")
		if !ok || !strings.EqualFold(scheme, "Bearer") {
			return operator{}, false
		}
		t, ok := c.keys.bySecret(strings.TrimSpace(secret))
		return operator{token: t}, ok
	}
	ck, err := r.Cookie(cookieName)
	if err != nil {
		return operator{}, false
	}
	s, ok := c.keys.session(ck.Value, c.cfg.Now())
	if !ok {
		return operator{}, false
	}
	return operator{token: s.token, session: &s}, true
}

// authed serves h to requests with a token of permission need; a POST
// must come from the console's own origin and, with the login cookie,
// carry the form's CSRF token.
func (c *Console) authed(need Permission, h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		op, ok := c.identify(r)
		if !ok {
			if r.Header.Get("Authorization") != "" {
				c.cfg.Logger.Warn("console: token refused", "path", r.URL.Path, "remote", r.RemoteAddr)
			}
			c.unauthorized(w, r, loginData{Next: safeNext(r.URL.RequestURI())})
			return
		}
		r = r.WithContext(context.WithValue(r.Context(), operatorKey{}, op))
		if r.Method == http.MethodPost {
			if err := checkOrigin(r, c.trusted, op.session != nil); err != nil {
				c.cfg.Logger.Warn("console: request refused", "path", r.URL.Path, "operator", op.token.Name, "error", err)
				c.fail(w, r, &op, http.StatusForbidden, err.Error())
				return
			}
			if op.session != nil && !op.session.checkCSRF(r.PostFormValue("csrf")) {
				c.cfg.Logger.Warn("console: request refused", "path", r.URL.Path, "operator", op.token.Name, "error", "CSRF token missing or wrong")
				c.fail(w, r, &op, http.StatusForbidden, "the form's CSRF token is missing or wrong: reload the page and try again")
				return
			}
		}
		if op.token.Permission < need {
			c.cfg.Logger.Warn("console: request refused", "path", r.URL.Path, "operator", op.token.Name, "error", "the token may read only")
			c.fail(w, r, &op, http.StatusForbidden, fmt.Sprintf("token %s may read only: replay and discard need a token with write permission", op.token.Name))
			return
		}
		h(w, r)
	})
}

func operatorOf(r *http.Request) operator {
	op, _ := r.Context().Value(operatorKey{}).(operator)
	return op
}

// page is what every page's layout shows.
type page struct {
	Title    string
	Nonce    string
	Operator string
	CanWrite bool
	CSRF     string
	Path     string
	// Content is the page's own data.
	Content any
}

// render executes the page name with data, buffered, so that a template
// error is a clean 500.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, data any) {
	p := page{Nonce: nonceOf(r), Path: Path, Content: data}
	if op, ok := r.Context().Value(operatorKey{}).(operator); ok {
		p.Operator, p.CanWrite = op.token.Name, op.token.Permission >= Write
		if op.session != nil {
			p.CSRF = op.session.csrf()
		}
	}
	var buf bytes.Buffer
	if err := c.pages[name].Execute(&buf, p); err != nil {
		c.cfg.Logger.Error("console: render", "page", name, "error", err)
		http.Error(w, "console: the page could not be rendered (see the service's log)", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func nonceOf(r *http.Request) string {
	n, _ := r.Context().Value(nonceKey{}).(string)
	return n
}

// errorData is the content of the error page.
type errorData struct {
	Status  int
	Message string
}

// fail renders the error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, op *operator, status int, msg string) {
	if op != nil {
		r = r.WithContext(context.WithValue(r.Context(), operatorKey{}, *op))
	}
	c.render(w, r, status, "error", errorData{Status: status, Message: msg})
}

// loginData is the content of the login page.
type loginData struct {
	// Next is where to go once logged in.
	Next  string
	Error string
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", loginData{Next: safeNext(r.URL.Query().Get("next"))})
}

// login sets the login cookie of the token whose secret the form gives.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if err := checkOrigin(r, c.trusted, true); err != nil {
		c.cfg.Logger.Warn("console: login refused", "error", err, "remote", r.RemoteAddr)
		c.fail(w, r, nil, http.StatusForbidden, err.Error())
		return
	}
	next := safeNext(r.PostFormValue("next"))
	t, ok := c.keys.bySecret(r.PostFormValue("token"))
	if !ok {
		c.cfg.Logger.Warn("console: login refused", "error", "unknown token", "remote", r.RemoteAddr)
		c.unauthorized(w, r, loginData{Next: next, Error: "unknown token"})
		return
	}
	expires := c.cfg.Now().Add(c.cfg.SessionLifetime)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: c.keys.cookieValue(t, expires), Path: Path, Expires: expires,
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r),
	})
	c.cfg.Logger.Info("console: login", "operator", t.Name, "remote", r.RemoteAddr)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	http.SetCookie(w, &http.Cookie{Name: cookieName, Path: Path, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: isHTTPS(r)})
	http.Redirect(w, r, Path+"login", http.StatusSeeOther)
}

// isHTTPS says whether the browser reached the console over HTTPS: the
// cookie is then Secure.
func isHTTPS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// safeNext returns next when it is a page of the console, else the dead
// letters: a login never redirects elsewhere.
func safeNext(next string) string {
	target, query, _ := strings.Cut(next, "?")
	// "/console/../metrics" and "/console/%2e%2e/metrics" leave the
	// console once the redirect or the browser cleans them: a target is
	// judged decoded, and taken only when cleaning leaves it as it is.
	decoded, err := url.PathUnescape(target)
	if cleaned := path.Clean(decoded); err != nil || decoded != target || cleaned != target && cleaned+"/" != target {
		target = ""
	}
	// ("//evil.example" cleans to "/evil.example": not taken.)
	if !strings.HasPrefix(target, Path) || strings.ContainsFunc(next, func(r rune) bool { return r == '\\' || r < ' ' || r == 0x7f }) {
		return Path + "dead-letters"
	}
	if query != "" {
		return target + "?" + query
	}
	return target
}

// pathID returns the {id} of r's path.
func pathID(r *http.Request) (int64, error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("dead letter id %q: want a positive integer", r.PathValue("id"))
	}
	return id, nil
}
