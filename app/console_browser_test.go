package app_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/testenv"
)

// screenshotsVar names a folder the browser test writes screenshots of
// the console's pages to (docs/ has them); unset, it writes none.
const screenshotsVar = "EFFECTIVELY_CONSOLE_SCREENSHOTS"

// chromium returns the path of Debian's chromium (scripts/services.sh
// installs it); without it the test fails under CI=true and is skipped
// elsewhere.
func chromium(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	testenv.Missing(t, "chromium is not installed: the console's browser test needs it (scripts/services.sh installs Debian's chromium package; run make test)")
	return ""
}

// browser starts one headless Chromium for the test and returns its tab's
// context, and a counter of the JavaScript dialogs (alert) its pages
// opened.
func browser(t *testing.T, path string) (context.Context, *atomic.Int32) {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.WindowSize(1280, 860),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Env("TMPDIR="+t.TempDir()), // its singleton socket, removed with the test's folders
	)
	if os.Geteuid() == 0 {
		opts = append(opts, chromedp.NoSandbox) // Chromium refuses to run as root with its sandbox
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelTab := chromedp.NewContext(allocCtx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() {
		cancelTimeout()
		cancelTab()
		cancelAlloc() // waits for the browser to exit
	})
	dialogs := new(atomic.Int32)
	require.NoError(t, chromedp.Listen(ctx, func(ev any) {
		if _, ok := ev.(*page.EventJavascriptDialogOpening); ok {
			dialogs.Add(1)
		}
	}))
	return ctx, dialogs
}

// TestConsoleBrowser drives the console in a real headless Chromium,
// against the service with its consumer, its replay relay and its
// database: refused without a token; a read-only token lists and opens
// but cannot replay; a form sent from another origin is refused; a write
// token lists the dead letters by consumer and code, opens a poison one
// whose body holds HTML, NUL and bytes that are not UTF-8 (shown, not
// run) and discards it, and replays another with a reason: the history
// shows it, the relay publishes it, and the consumer applies it.
func TestConsoleBrowser(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	var refuse atomic.Bool // the consumer refuses w-1 while set
	refuse.Store(true)
	var refuseBulk atomic.Bool // and the events b-* while this is set
	refuseBulk.Store(true)
	refuseW1 := func(next message.HandlerFunc) message.HandlerFunc {
		return func(msg *message.Message) ([]*message.Message, error) {
			if d, ok := framework.EnvelopeFromContext(msg.Context()); ok && d.ID == "w-1" && refuse.Load() {
				return nil, framework.Permanent("gear_refused", nil)
			}
			if d, ok := framework.EnvelopeFromContext(msg.Context()); ok && strings.HasPrefix(d.ID, "b-") && refuseBulk.Load() {
				return nil, framework.Permanent("bulk_refused", nil)
			}
			return next(msg)
		}
	}
	b := setup(t, consoleConfig(t), fx.Supply(app.Middleware{Outer: []message.HandlerMiddleware{refuseW1}}))
	b.publish(t, "w-1", "gear")
	poison := []byte("<script>alert(1)</script>\x00\xff\xfe<img src=x onerror=alert(2)>")
	require.NoError(t, b.transport.Publisher().Publish(widgetAdded.Type(), message.NewMessage(watermill.NewUUID(), poison)))
	waitFor(t, "two dead letters", func() bool { return b.count(t, `SELECT count(*) FROM dead_letters`) == 2 })
	var gearID, poisonID int64
	require.NoError(t, b.db.Get(&gearID, `SELECT id FROM dead_letters WHERE code = 'gear_refused'`))
	require.NoError(t, b.db.Get(&poisonID, `SELECT id FROM dead_letters WHERE code = 'malformed_envelope'`))

	base := "http://" + b.http.Addr() + "/console/"
	gearPage := fmt.Sprintf("%sdead-letters/%d", base, gearID)
	// Another origin (same host, another port): its page sends the replay
	// form to the console as soon as it loads.
	evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, `<!doctype html><form id="f" method="post" action="%s/replay"><input name="reason" value="forged"></form>
<script>document.getElementById("f").submit()</script>`, gearPage)
	}))
	t.Cleanup(evil.Close)
	// The steps build on each other: the first that fails ends the test.
	step := func(name string, f func(t *testing.T)) {
		t.Helper()
		if !t.Run(name, f) {
			t.FailNow()
		}
	}

	ctx, dialogs := browser(t, exe)
	shots := os.Getenv(screenshotsVar)
	screenshot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			if shots == "" {
				return nil
			}
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(shots, "console-"+name+".png"), png, 0o644)
		})
	}
	// Each step gets stepLimit: a page that does not come fails the
	// test instead of hanging it.
	const stepLimit = 15 * time.Second
	run := func(t *testing.T, what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, stepLimit)
		defer cancel()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	text := func(t *testing.T, sel string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, stepLimit)
		defer cancel()
		for {
			s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
			if err != nil && ctx.Err() == nil && strings.Contains(err.Error(), "No node with given id") {
				// The page rendered the element again between its
				// query and its read: read the new one.
				continue
			}
			require.NoError(t, err, sel)
			return s
		}
	}
	present := func(t *testing.T, sel string) bool {
		t.Helper()
		ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](fmt.Sprintf(`document.querySelector(%q) !== null`, sel)))
		require.NoError(t, err, sel)
		return ok
	}
	login := func(t *testing.T, secret string) {
		t.Helper()
		run(t, "log in",
			chromedp.Navigate(base+"dead-letters"),
			chromedp.WaitVisible(chromedp.CSS("#token")),
			chromedp.SendKeys(chromedp.CSS("#token"), secret),
			chromedp.Submit(chromedp.CSS("#login")),
			chromedp.WaitVisible(chromedp.CSS("#groups")),
		)
	}
	status := func(t *testing.T) driver.DeadLetterStatus {
		t.Helper()
		var s string
		require.NoError(t, b.db.Get(&s, `SELECT status FROM dead_letters WHERE id = ?`, gearID))
		return driver.DeadLetterStatus(s)
	}

	step("RefusedWithoutToken", func(t *testing.T) {
		run(t, "open without a token", chromedp.Navigate(gearPage), chromedp.WaitVisible(chromedp.CSS("#login")))
		require.False(t, present(t, "#fields"), "no dead letter without a token")
		run(t, "a wrong token", chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token-0123456789"), chromedp.Submit(chromedp.CSS("#login")),
			chromedp.WaitVisible(chromedp.CSS("#error")))
		require.Equal(t, "unknown token", text(t, "#error"))
		run(t, "screenshot", screenshot("login"))
	})

	step("ReadOnlyCannotReplay", func(t *testing.T) {
		login(t, consoleReadSecret)
		require.Equal(t, "bob (read only)", text(t, "#operator"))
		run(t, "open", chromedp.Navigate(gearPage), chromedp.WaitVisible(chromedp.CSS("#read-only")))
		require.False(t, present(t, "#replay"), "no replay form for a read-only token")
		// The form is not there: make it, CSRF token and all, and send it.
		run(t, "send a replay form", chromedp.Evaluate[chromedp.Void](`(() => {
			const f = document.createElement("form");
			f.method = "post";
			f.action = location.pathname + "/replay";
			for (const [k, v] of [["reason", "try"], ["csrf", document.querySelector("input[name=csrf]").value]]) {
				const i = document.createElement("input");
				i.name = k;
				i.value = v;
				f.appendChild(i);
			}
			document.body.appendChild(f);
			f.submit();
		})()`), chromedp.WaitVisible(chromedp.CSS("#error")))
		require.Contains(t, text(t, "#error"), "token bob may read only")
		require.Equal(t, driver.DeadLetterPending, status(t))
		run(t, "log out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#login")))
	})

	step("ListByConsumerAndCode", func(t *testing.T) {
		login(t, consoleWriteSecret)
		require.Equal(t, "alice (write)", text(t, "#operator"))
		groups := text(t, "#groups")
		require.Contains(t, groups, consumerName+"\tgear_refused\t1")
		require.Contains(t, groups, consumerName+"\tmalformed_envelope\t1")
		require.Equal(t, "2", text(t, "#total"))
		run(t, "screenshot", screenshot("dead-letters"))
		run(t, "select a group", chromedp.Click(chromedp.CSS("#groups tbody tr:first-child a")), chromedp.WaitVisible(chromedp.CSS("#list")))
		require.Contains(t, text(t, "#list"), "gear_refused")
		require.NotContains(t, text(t, "#list"), "malformed_envelope")
	})

	step("CrossOriginRefused", func(t *testing.T) {
		run(t, "a page of another origin sends the replay form", chromedp.Navigate(evil.URL), chromedp.WaitVisible(chromedp.CSS("#error")))
		require.Contains(t, text(t, "#error"), "cross-origin request refused")
		require.Equal(t, driver.DeadLetterPending, status(t))
	})

	step("PoisonShownNotRun", func(t *testing.T) {
		run(t, "open the poison", chromedp.Navigate(fmt.Sprintf("%sdead-letters/%d", base, poisonID)), chromedp.WaitVisible(chromedp.CSS("#body")))
		body, err := chromedp.Run(ctx, chromedp.TextContent(chromedp.CSS("#body")))
		require.NoError(t, err)
		require.Equal(t, `<script>alert(1)</script>\x00\xff\xfe<img src=x onerror=alert(2)>`, body)
		require.Contains(t, text(t, "#body-note"), "bytes that are not UTF-8")
		n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#body *").length + document.querySelectorAll("img").length`))
		require.NoError(t, err)
		require.Zero(t, n, "the body made no element")
		run(t, "screenshot", screenshot("poison"))
		run(t, "discard it",
			chromedp.SendKeys(chromedp.CSS("#discard-reason"), "not a CloudEvent: the producer is fixed"),
			chromedp.Submit(chromedp.CSS("#discard")),
			chromedp.WaitVisible(chromedp.CSS("#done")),
		)
		require.Equal(t, "discarded", text(t, "#status"))
		require.Contains(t, text(t, "#history"), "discarded\tby alice: not a CloudEvent: the producer is fixed")
	})

	step("ReplayWithReason", func(t *testing.T) {
		refuse.Store(false)
		run(t, "replay",
			chromedp.Navigate(gearPage),
			chromedp.WaitVisible(chromedp.CSS("#replay-reason")),
			chromedp.SendKeys(chromedp.CSS("#replay-reason"), "the gear supplier is back"),
			chromedp.Submit(chromedp.CSS("#replay")),
			chromedp.WaitVisible(chromedp.CSS("#done")),
		)
		require.Equal(t, "replayed", text(t, "#status"))
		history := text(t, "#history")
		require.Contains(t, history, "failed\tcode gear_refused")
		require.Contains(t, history, "replayed\tby alice: the gear supplier is back")
		run(t, "screenshot", screenshot("dead-letter"))
		waitFor(t, "the replayed widget", func() bool { return b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'w-1'`) == 1 })
		require.Equal(t, driver.DeadLetterReplayed, status(t))

		run(t, "the event view", chromedp.Click(chromedp.CSS("#fields a[href*=events]")), chromedp.WaitVisible(chromedp.CSS("#applied")))
		require.Contains(t, text(t, "#applied"), consumerName)
		require.True(t, strings.Contains(text(t, "main"), "replayed\tby alice: the gear supplier is back"))
		run(t, "screenshot", screenshot("event"))

		run(t, "the consumers view", chromedp.Navigate(base+"consumers"), chromedp.WaitVisible(chromedp.CSS("#consumers")))
		require.Contains(t, text(t, "#consumers"), consumerName+"\twidgets.widget.added\tsqlite group "+consumerName)
		run(t, "screenshot", screenshot("consumers"))
	})

	pendingBulk := func(t *testing.T) int {
		t.Helper()
		return b.count(t, `SELECT count(*) FROM dead_letters WHERE code = 'bulk_refused' AND status = 'pending'`)
	}
	fillBulk := func(t *testing.T) {
		t.Helper()
		before := b.count(t, `SELECT count(*) FROM dead_letters WHERE code = 'bulk_refused'`)
		for i := range 4 {
			b.publish(t, fmt.Sprintf("b-%d", before+i+1), "bulk")
		}
		waitFor(t, "four more bulk dead letters", func() bool {
			return b.count(t, `SELECT count(*) FROM dead_letters WHERE code = 'bulk_refused'`) == before+4
		})
	}
	jobStatus := func(t *testing.T) string {
		t.Helper()
		return text(t, "#job-status")
	}
	waitStatus := func(t *testing.T, want string) {
		t.Helper()
		deadline := time.Now().Add(stepLimit)
		for jobStatus(t) != want {
			require.True(t, time.Now().Before(deadline), "the job's page shows %s", want)
			time.Sleep(100 * time.Millisecond)
		}
	}

	step("BulkReplayByFilter", func(t *testing.T) {
		fillBulk(t)
		run(t, "preview",
			chromedp.Navigate(base+"bulk"),
			chromedp.WaitVisible(chromedp.CSS("#bulk")),
			chromedp.SendKeys(chromedp.CSS("#bulk-consumer"), consumerName),
			chromedp.SendKeys(chromedp.CSS("#bulk-code"), "bulk_refused"),
			chromedp.SendKeys(chromedp.CSS("#bulk-rate"), "3"),
			chromedp.Click(chromedp.CSS("#bulk-preview")),
			chromedp.WaitVisible(chromedp.CSS("#preview")),
		)
		require.Equal(t, "4 would be replayed, 0 refused; nothing recorded.", text(t, "#preview"))
		require.Zero(t, b.count(t, `SELECT count(*) FROM bulk_jobs`), "a preview records nothing")
		require.Equal(t, 4, pendingBulk(t))
		run(t, "screenshot", screenshot("bulk-preview"))

		refuseBulk.Store(false)
		run(t, "start",
			chromedp.SendKeys(chromedp.CSS("#bulk-reason"), "the bulk supplier is back"),
			chromedp.Click(chromedp.CSS("#bulk-start")),
			chromedp.WaitVisible(chromedp.CSS("#job-status")),
		)
		// The page reads its progress while it runs, and loads again once
		// it ends.
		waitStatus(t, "done")
		require.Equal(t, "4 replayed, 0 refused, of 4", text(t, "#job-progress"))
		run(t, "screenshot", screenshot("bulk-job"))
		waitFor(t, "the replayed bulk widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets WHERE event_id LIKE 'b-%'`) == 4 })
		require.Zero(t, pendingBulk(t))
		require.Equal(t, 4, b.count(t, `SELECT count(*) FROM dead_letter_history WHERE kind = 'replayed' AND actor = 'alice' AND reason = 'the bulk supplier is back'`))
	})

	step("BulkCancel", func(t *testing.T) {
		refuseBulk.Store(true)
		fillBulk(t)
		run(t, "start a slow discard",
			chromedp.Navigate(base+"bulk"),
			chromedp.WaitVisible(chromedp.CSS("#bulk")),
			chromedp.SetValue(chromedp.CSS("#bulk-kind"), "discard"),
			chromedp.SendKeys(chromedp.CSS("#bulk-consumer"), consumerName),
			chromedp.SendKeys(chromedp.CSS("#bulk-code"), "bulk_refused"),
			chromedp.SendKeys(chromedp.CSS("#bulk-rate"), "0.05"),
			chromedp.SendKeys(chromedp.CSS("#bulk-reason"), "too late"),
			chromedp.Click(chromedp.CSS("#bulk-start")),
			chromedp.WaitVisible(chromedp.CSS("#cancel")),
		)
		waitFor(t, "one discarded", func() bool { return pendingBulk(t) == 3 })
		require.Equal(t, "running", jobStatus(t))
		run(t, "cancel", chromedp.Click(chromedp.CSS("#cancel button")), chromedp.WaitNotPresent(chromedp.CSS("#cancel")))
		require.Equal(t, "cancelled", jobStatus(t))
		require.Equal(t, 3, pendingBulk(t), "it stopped before the next")
	})

	step("BulkInterruptedResumed", func(t *testing.T) {
		refuseBulk.Store(false)
		// A job left running by a process that is gone: its heartbeat is
		// an hour old.
		old := time.Now().Add(-time.Hour).UnixNano()
		res, err := b.db.Exec(`INSERT INTO bulk_jobs (kind, filter, rate, reason, by_name, status, total, owner, heartbeat_at, created_at, updated_at)
VALUES ('replay', ?, 0, 'resumed after a crash', 'alice', 'running', 3, 'gone:1:dead', ?, ?, ?)`,
			`{"consumer":"`+consumerName+`","code":"bulk_refused"}`, old, old, old)
		require.NoError(t, err)
		id, err := res.LastInsertId()
		require.NoError(t, err)
		run(t, "open it", chromedp.Navigate(fmt.Sprintf("%sbulk/%d", base, id)), chromedp.WaitVisible(chromedp.CSS("#resume")))
		require.Equal(t, "interrupted", jobStatus(t))
		require.Contains(t, text(t, "#interrupted"), "Resume goes on after dead letter 0")
		run(t, "screenshot", screenshot("bulk-interrupted"))
		run(t, "resume", chromedp.Click(chromedp.CSS("#resume button")), chromedp.WaitNotPresent(chromedp.CSS("#resume")))
		waitStatus(t, "done")
		require.Equal(t, "3 replayed, 0 refused, of 3", text(t, "#job-progress"))
		require.Zero(t, pendingBulk(t))
		waitFor(t, "the resumed replays applied", func() bool {
			return b.count(t, `SELECT count(*) FROM widgets WHERE event_id LIKE 'b-%'`) == 7
		})
	})
	require.Zero(t, dialogs.Load(), "no page opened a dialog: no script of a body ran")
}
