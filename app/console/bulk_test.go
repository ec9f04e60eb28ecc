package console_test

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app/console"
	"github.com/effectively-once/effectively/framework/driver"
)

// jobs returns the bulk jobs of b's store.
func (b *bundle) jobs(t *testing.T) driver.BulkJobs {
	t.Helper()
	j, ok := b.store.(driver.BulkJobs)
	require.True(t, ok, "the store keeps bulk jobs")
	return j
}

// waitJob waits until the job id satisfies ok, and returns it.
func (b *bundle) waitJob(t *testing.T, id int64, what string, ok func(driver.BulkJob) bool) driver.BulkJob {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for {
		j, err := b.jobs(t).BulkJob(context.Background(), id)
		require.NoError(t, err)
		if ok(j) {
			return j
		}
		require.True(t, time.Now().Before(deadline), "bulk job %d: %s; it is %+v", id, what, j)
		time.Sleep(20 * time.Millisecond)
	}
}

// bulkForm returns the form of a bulk job of kind on consumer and code.
func bulkForm(csrf, kind, consumer, code, rate, reason string) url.Values {
	return url.Values{"csrf": {csrf}, "kind": {kind}, "consumer": {consumer}, "code": {code}, "rate": {rate}, "reason": {reason}}
}

// startJob sends the form as alice and returns the job it started.
func (b *bundle) startJob(t *testing.T, cookie string, form url.Values) int64 {
	t.Helper()
	code, page, resp := b.do(t, http.MethodPost, "/console/bulk", form, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusSeeOther, code, page)
	loc := resp.Header.Get("Location")
	require.True(t, strings.HasPrefix(loc, "/console/bulk/"), loc)
	id, err := strconv.ParseInt(strings.TrimPrefix(loc, "/console/bulk/"), 10, 64)
	require.NoError(t, err)
	return id
}

// TestBulkReplay previews a bulk replay by consumer and code, which
// records nothing, then starts it: the job replays each pending dead
// letter the filter selects, refusing those the console refuses, and its
// page shows its progress to the end. On both databases.
func TestBulkReplay(t *testing.T) {
	t.Parallel()
	refuse := func(dl driver.DeadLetter, _ time.Time) string {
		if dl.EventID == "w-old" {
			return "too old"
		}
		return ""
	}
	for name, open := range map[string]func(*testing.T, console.Config) *bundle{"SQLite": setup, "Postgres": setupPostgres} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := open(t, console.Config{RefuseReplay: refuse})
			var ids []int64
			for _, id := range []string{"w-1", "w-2", "w-old"} {
				ids = append(ids, b.deadLetter(t, "widgets", id, "gear_refused", []byte(`{}`), nil))
			}
			other := b.deadLetter(t, "widgets", "w-3", "other_code", []byte(`{}`), nil)
			cookie, _ := b.login(t, writeSecret)
			csrf := b.csrf(t, cookie, "/console/bulk")

			code, page, _ := b.do(t, http.MethodPost, "/console/bulk/preview", bulkForm(csrf, "replay", "widgets", "gear_refused", "", ""),
				"Cookie", cookie, "Origin", b.server.URL)
			require.Equal(t, http.StatusOK, code, page)
			require.Contains(t, page, "2 would be replayed, 1 refused; nothing recorded.")
			require.Contains(t, page, "refused: too old")
			jobs, err := b.jobs(t).ListBulkJobs(context.Background(), 10)
			require.NoError(t, err)
			require.Empty(t, jobs, "a preview records no job")
			dl, err := b.store.DeadLetter(context.Background(), ids[0])
			require.NoError(t, err)
			require.Equal(t, driver.DeadLetterPending, dl.Status)

			id := b.startJob(t, cookie, bulkForm(csrf, "replay", "widgets", "gear_refused", "50", "the gear supplier is back"))
			j := b.waitJob(t, id, "done", func(j driver.BulkJob) bool { return j.Status == driver.BulkJobDone })
			require.Equal(t, driver.BulkJobProgress{Done: 2, Refused: 1, LastID: ids[2]}, j.BulkJobProgress)
			require.EqualValues(t, 3, j.Total)
			require.Equal(t, "alice", j.By)
			for i, want := range []driver.DeadLetterStatus{driver.DeadLetterReplayed, driver.DeadLetterReplayed, driver.DeadLetterPending} {
				dl, err := b.store.DeadLetter(context.Background(), ids[i])
				require.NoError(t, err)
				require.Equal(t, want, dl.Status, "dead letter %d", ids[i])
				if want == driver.DeadLetterReplayed {
					require.Equal(t, "alice", dl.Resolution.By)
					require.Equal(t, "the gear supplier is back", dl.Resolution.Reason)
				}
			}
			dl, err = b.store.DeadLetter(context.Background(), other)
			require.NoError(t, err)
			require.Equal(t, driver.DeadLetterPending, dl.Status, "another code is not selected")

			code, page, _ = b.do(t, http.MethodGet, "/console/bulk/"+itoa(id), nil, "Cookie", cookie)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, page, `id="job-status">done<`)
			require.Contains(t, page, "2 replayed, 1 refused, of 3")
			require.NotContains(t, page, `id="cancel"`)
			code, page, _ = b.do(t, http.MethodGet, "/console/bulk", nil, "Cookie", cookie)
			require.Equal(t, http.StatusOK, code)
			require.Contains(t, page, `href="/console/bulk/`+itoa(id)+`"`)
		})
	}
}

// TestBulkFormRefused: a job without a reason, a filter, or with a rate
// or a time the command line refuses is not started.
func TestBulkFormRefused(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	b.deadLetter(t, "widgets", "w-1", "gear_refused", []byte(`{}`), nil)
	cookie, _ := b.login(t, writeSecret)
	csrf := b.csrf(t, cookie, "/console/bulk")
	for what, form := range map[string]url.Values{
		"say why in the reason":        bulkForm(csrf, "replay", "widgets", "", "", ""),
		"select the dead letters":      bulkForm(csrf, "discard", "", "", "", "why"),
		"rate: want at least":          bulkForm(csrf, "replay", "widgets", "", "0.0001", "why"),
		"what: want replay or discard": bulkForm(csrf, "purge", "widgets", "", "", "why"),
		"until: want an RFC 3339": func() url.Values {
			f := bulkForm(csrf, "replay", "widgets", "", "", "why")
			f.Set("until", "yesterday")
			return f
		}(),
	} {
		code, page, _ := b.do(t, http.MethodPost, "/console/bulk", form, "Cookie", cookie, "Origin", b.server.URL)
		require.Equal(t, http.StatusBadRequest, code, what)
		require.Contains(t, page, "Nothing started: "+strings.ReplaceAll(what, "'", "&#39;"), what)
	}
	jobs, err := b.jobs(t).ListBulkJobs(context.Background(), 10)
	require.NoError(t, err)
	require.Empty(t, jobs)
}

// TestBulkCancel: a job cancelled stops before its next dead letter and
// shows as cancelled; it cannot be cancelled again.
func TestBulkCancel(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	var ids []int64
	for _, id := range []string{"w-1", "w-2", "w-3"} {
		ids = append(ids, b.deadLetter(t, "widgets", id, "gear_refused", []byte(`{}`), nil))
	}
	cookie, _ := b.login(t, writeSecret)
	csrf := b.csrf(t, cookie, "/console/bulk")
	// One every 20 seconds: the first at once, the next long after.
	id := b.startJob(t, cookie, bulkForm(csrf, "discard", "widgets", "", "0.05", "the widgets are gone"))
	b.waitJob(t, id, "one discarded", func(j driver.BulkJob) bool { return j.Done == 1 })
	code, page, _ := b.do(t, http.MethodGet, "/console/bulk/"+itoa(id), nil, "Cookie", cookie)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="job-status">running<`)
	require.Contains(t, page, "1 discarded, 0 refused, of 3")

	code, page, _ = b.do(t, http.MethodPost, "/console/bulk/"+itoa(id)+"/cancel", url.Values{"csrf": {csrf}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusSeeOther, code, page)
	b.console.Close() // waits for the runner
	j := b.waitJob(t, id, "cancelled", func(j driver.BulkJob) bool { return j.Status == driver.BulkJobCancelled })
	require.EqualValues(t, 1, j.Done)
	for i, id := range ids {
		dl, err := b.store.DeadLetter(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, map[bool]driver.DeadLetterStatus{true: driver.DeadLetterDiscarded, false: driver.DeadLetterPending}[i == 0], dl.Status)
	}
	code, page, _ = b.do(t, http.MethodGet, "/console/bulk/"+itoa(id), nil, "Cookie", cookie)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="job-status">cancelled<`)
	require.NotContains(t, page, `id="cancel"`)
	require.NotContains(t, page, `id="resume"`)
	code, page, _ = b.do(t, http.MethodPost, "/console/bulk/"+itoa(id)+"/cancel", url.Values{"csrf": {csrf}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusConflict, code)
	require.Contains(t, page, "Not cancelled: the bulk job ended.")
}

// TestBulkInterruptedResumed: a job whose process stopped (Close) stays
// running until its heartbeat is stale, then shows as interrupted; another
// process resumes it after the last dead letter it handled. A job still
// running cannot be resumed.
func TestBulkInterruptedResumed(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	var ids []int64
	for _, id := range []string{"w-1", "w-2", "w-3", "w-4"} {
		ids = append(ids, b.deadLetter(t, "widgets", id, "gear_refused", []byte(`{}`), nil))
	}
	cookie, _ := b.login(t, writeSecret)
	csrf := b.csrf(t, cookie, "/console/bulk")
	id := b.startJob(t, cookie, bulkForm(csrf, "replay", "widgets", "", "4", "fixed"))
	b.waitJob(t, id, "one replayed", func(j driver.BulkJob) bool { return j.Done >= 1 })
	code, page, _ := b.do(t, http.MethodPost, "/console/bulk/"+itoa(id)+"/resume", url.Values{"csrf": {csrf}}, "Cookie", cookie, "Origin", b.server.URL)
	require.Equal(t, http.StatusConflict, code, "its process runs it")
	require.Contains(t, page, "Not resumed: the bulk job is not interrupted.")

	b.console.Close() // the service stops
	stopped, err := b.jobs(t).BulkJob(context.Background(), id)
	require.NoError(t, err)
	require.Equal(t, driver.BulkJobRunning, stopped.Status, "until its heartbeat is stale")
	require.Less(t, stopped.Done, int64(4))
	// Its heartbeat goes stale.
	_, err = b.db.Exec(`UPDATE bulk_jobs SET heartbeat_at = ? WHERE id = ?`, time.Now().Add(-time.Hour).UnixNano(), id)
	require.NoError(t, err)

	// The service starts again: another process.
	b2 := setupOn(t, console.Config{}, b.store)
	cookie, _ = b2.login(t, writeSecret)
	code, page, _ = b2.do(t, http.MethodGet, "/console/bulk/"+itoa(id), nil, "Cookie", cookie)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="job-status">interrupted<`)
	require.Contains(t, page, "Resume goes on after dead letter "+itoa(stopped.LastID))
	require.Contains(t, page, `id="resume"`)
	csrf = b2.csrf(t, cookie, "/console/bulk/"+itoa(id))
	code, page, _ = b2.do(t, http.MethodPost, "/console/bulk/"+itoa(id)+"/resume", url.Values{"csrf": {csrf}}, "Cookie", cookie, "Origin", b2.server.URL)
	require.Equal(t, http.StatusSeeOther, code, page)
	j := b2.waitJob(t, id, "done", func(j driver.BulkJob) bool { return j.Status == driver.BulkJobDone })
	require.Equal(t, driver.BulkJobProgress{Done: 4, LastID: ids[3]}, j.BulkJobProgress)
	require.NotEqual(t, stopped.Owner, j.Owner, "the new process runs it")
	for _, id := range ids {
		dl, err := b.store.DeadLetter(context.Background(), id)
		require.NoError(t, err)
		require.Equal(t, driver.DeadLetterReplayed, dl.Status)
	}
}

// TestBulkNeedsWrite: a read-only token sees the jobs but no form, and
// its preview, start, cancel and resume are refused as a single replay's,
// by cookie and by bearer token.
func TestBulkNeedsWrite(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	b.deadLetter(t, "widgets", "w-1", "gear_refused", []byte(`{}`), nil)
	b.deadLetter(t, "widgets", "w-2", "gear_refused", []byte(`{}`), nil)
	alice, _ := b.login(t, writeSecret)
	id := b.startJob(t, alice, bulkForm(b.csrf(t, alice, "/console/bulk"), "replay", "widgets", "", "0.05", "fixed"))
	bob, _ := b.login(t, readSecret)
	code, page, _ := b.do(t, http.MethodGet, "/console/bulk", nil, "Cookie", bob)
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, page, `id="read-only"`)
	require.NotContains(t, page, `id="bulk"`)
	csrf := b.csrf(t, bob, "/console/bulk")
	for _, path := range []string{"/console/bulk/preview", "/console/bulk", "/console/bulk/" + itoa(id) + "/cancel", "/console/bulk/" + itoa(id) + "/resume"} {
		form := bulkForm(csrf, "replay", "widgets", "", "", "bob's")
		code, page, _ := b.do(t, http.MethodPost, path, form, "Cookie", bob, "Origin", b.server.URL)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, page, "token bob may read only", path)
		code, _, _ = b.do(t, http.MethodPost, path, form, bearer(readSecret)...)
		require.Equal(t, http.StatusForbidden, code, path)
	}
	jobs, err := b.jobs(t).ListBulkJobs(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, jobs, 1)
	require.Equal(t, driver.BulkJobRunning, jobs[0].Status, "not cancelled")
}

// TestBulkCSRF: the bulk forms sent with the login cookie need the form's
// CSRF token and the console's origin.
func TestBulkCSRF(t *testing.T) {
	t.Parallel()
	b := setup(t, console.Config{})
	// Two: the job waits 20 seconds after the first.
	b.deadLetter(t, "widgets", "w-1", "gear_refused", []byte(`{}`), nil)
	b.deadLetter(t, "widgets", "w-2", "gear_refused", []byte(`{}`), nil)
	cookie, _ := b.login(t, writeSecret)
	csrf := b.csrf(t, cookie, "/console/bulk")
	id := b.startJob(t, cookie, bulkForm(csrf, "replay", "widgets", "", "0.05", "fixed"))
	for _, path := range []string{"/console/bulk/preview", "/console/bulk", "/console/bulk/" + itoa(id) + "/cancel"} {
		code, page, _ := b.do(t, http.MethodPost, path, bulkForm("", "replay", "widgets", "", "", "forged"), "Cookie", cookie, "Origin", b.server.URL)
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, page, "CSRF token is missing or wrong", path)
		code, page, _ = b.do(t, http.MethodPost, path, bulkForm(csrf, "replay", "widgets", "", "", "forged"), "Cookie", cookie, "Origin", "https://evil.example")
		require.Equal(t, http.StatusForbidden, code, path)
		require.Contains(t, page, "cross-origin request refused", path)
	}
	jobs, err := b.jobs(t).ListBulkJobs(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, jobs, 1, "no job started")
	require.Equal(t, driver.BulkJobRunning, jobs[0].Status, "not cancelled")
}
