package console

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/effectively-once/effectively/app/internal/bulk"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// Figures of the bulk jobs.
const (
	// bulkPage is how many dead letters a bulk job or its preview reads at
	// once.
	bulkPage = 500
	// bulkSample is how many dead letters a preview lists.
	bulkSample = 20
	// bulkListed is how many jobs the bulk page lists.
	bulkListed = 20
	// bulkHeartbeat is how often a runner says it runs its job: well
	// within driver.BulkJobStale.
	bulkHeartbeat = driver.BulkJobStale / 6
)

// newOwner returns the name of this console's process among the bulk
// jobs' owners: host, process id and a random part, unique per Console.
func newOwner() string {
	host, _ := os.Hostname()
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b))
}

// bulkForm is the form of a bulk job, as the operator typed it.
type bulkForm struct {
	Kind, Consumer, Code, Since, Until, Rate, Reason string
}

// bulkPreviewLine is one dead letter of a preview.
type bulkPreviewLine struct {
	DL driver.DeadLetter
	// Refused says why it would be refused; empty when it would not.
	Refused string
}

// bulkPreview is what a job would do now.
type bulkPreview struct {
	Kind          driver.BulkJobKind
	Todo, Refused int64
	// Sample are the first dead letters it would handle.
	Sample []bulkPreviewLine
}

// bulkData is the content of the bulk page.
type bulkData struct {
	// Unavailable says the store keeps no bulk jobs.
	Unavailable bool
	Form        bulkForm
	Preview     *bulkPreview
	Error       string
	Jobs        []driver.BulkJob
}

// bulkJobData is the content of a bulk job's page.
type bulkJobData struct {
	Job driver.BulkJob
	// Percent is how far it went, of its total.
	Percent int
	Error   string
}

// parse returns the job f asks for, or why it cannot be.
func (f bulkForm) parse() (driver.BulkJob, error) {
	j := driver.BulkJob{
		Kind: driver.BulkJobKind(f.Kind), Reason: f.Reason,
		Filter: driver.DeadLetterFilter{Consumer: f.Consumer, Code: framework.Code(f.Code)},
	}
	if j.Kind != driver.BulkReplay && j.Kind != driver.BulkDiscard {
		return j, fmt.Errorf("what: want %s or %s, got %q", driver.BulkReplay, driver.BulkDiscard, f.Kind)
	}
	var err error
	if j.Filter.FailedSince, err = bulk.ParseTime(f.Since); err != nil {
		return j, fmt.Errorf("since: %w", err)
	}
	if j.Filter.FailedBefore, err = bulk.ParseTime(f.Until); err != nil {
		return j, fmt.Errorf("until: %w", err)
	}
	if err := bulk.CheckWindow(j.Filter.FailedSince, j.Filter.FailedBefore); err != nil {
		return j, err
	}
	if j.Filter == (driver.DeadLetterFilter{}) {
		return j, errors.New("select the dead letters: give a consumer, a code, a since or an until")
	}
	if f.Rate != "" {
		if j.Rate, err = strconv.ParseFloat(f.Rate, 64); err != nil {
			return j, fmt.Errorf("rate: want a number of dead letters a second, got %q", f.Rate)
		}
		if err := bulk.CheckRate(j.Rate); err != nil {
			return j, fmt.Errorf("rate: %w", err)
		}
	}
	return j, nil
}

// bulkFormOf reads the bulk form of r.
func bulkFormOf(r *http.Request) bulkForm {
	v := func(k string) string { return strings.TrimSpace(r.PostFormValue(k)) }
	return bulkForm{Kind: v("kind"), Consumer: v("consumer"), Code: v("code"), Since: v("since"), Until: v("until"), Rate: v("rate"), Reason: v("reason")}
}

// bulkPage shows the bulk form and the latest jobs.
func (c *Console) bulkPage(w http.ResponseWriter, r *http.Request) {
	c.renderBulk(w, r, http.StatusOK, bulkData{Form: bulkForm{Kind: string(driver.BulkReplay)}})
}

// renderBulk renders the bulk page of d, with the latest jobs.
func (c *Console) renderBulk(w http.ResponseWriter, r *http.Request, status int, d bulkData) {
	if c.jobs == nil {
		d.Unavailable = true
		c.render(w, r, status, "bulk", d)
		return
	}
	var err error
	if d.Jobs, err = c.jobs.ListBulkJobs(r.Context(), bulkListed); err != nil {
		c.internal(w, r, "list bulk jobs", err)
		return
	}
	c.render(w, r, status, "bulk", d)
}

// bulkPreview answers the dry run of the form: what the job would do
// now, recording nothing.
func (c *Console) bulkPreview(w http.ResponseWriter, r *http.Request) {
	d := bulkData{Form: bulkFormOf(r)}
	j, err := d.Form.parse()
	if err != nil {
		d.Error = "Nothing previewed: " + err.Error() + "."
		c.renderBulk(w, r, http.StatusBadRequest, d)
		return
	}
	p, err := c.preview(r.Context(), j)
	if err != nil {
		c.internal(w, r, "preview a bulk job", err)
		return
	}
	d.Preview = &p
	c.renderBulk(w, r, http.StatusOK, d)
}

// preview reads the pending dead letters j selects and says what j would
// do to each, as the command line's dry run.
func (c *Console) preview(ctx context.Context, j driver.BulkJob) (bulkPreview, error) {
	p := bulkPreview{Kind: j.Kind}
	f := j.Filter
	f.Status, f.Limit, f.WithoutBody = driver.DeadLetterPending, bulkPage, true
	now := c.cfg.Now()
	for {
		dls, err := c.cfg.Store.DeadLetters(ctx, f)
		if err != nil {
			return p, err
		}
		for _, dl := range dls {
			line := bulkPreviewLine{DL: dl}
			if j.Kind == driver.BulkReplay {
				line.Refused = c.cfg.RefuseReplay(dl, now)
			}
			if line.Refused != "" {
				p.Refused++
			} else {
				p.Todo++
			}
			if len(p.Sample) < bulkSample {
				p.Sample = append(p.Sample, line)
			}
		}
		if len(dls) < f.Limit {
			return p, nil
		}
		f.AfterID = dls[len(dls)-1].ID
	}
}

// bulkStart records the job of the form and runs it in this process.
func (c *Console) bulkStart(w http.ResponseWriter, r *http.Request) {
	d := bulkData{Form: bulkFormOf(r)}
	if c.jobs == nil {
		c.renderBulk(w, r, http.StatusNotImplemented, d)
		return
	}
	j, err := d.Form.parse()
	if err == nil && j.Reason == "" {
		err = errors.New("say why in the reason: it is kept in each dead letter's history")
	}
	if err == nil {
		st := driver.DeadLetterReplayed
		if j.Kind == driver.BulkDiscard {
			st = driver.DeadLetterDiscarded
		}
		err = resolutionError(driver.Resolution{Status: st, By: operatorOf(r).token.Name, Reason: j.Reason}.Validate())
	}
	if err != nil {
		d.Error = "Nothing started: " + err.Error() + "."
		c.renderBulk(w, r, http.StatusBadRequest, d)
		return
	}
	p, err := c.preview(r.Context(), j)
	if err != nil {
		c.internal(w, r, "count the dead letters of a bulk job", err)
		return
	}
	j.By, j.Owner, j.Total = operatorOf(r).token.Name, c.owner, p.Todo+p.Refused
	if j, err = c.jobs.CreateBulkJob(r.Context(), j); err != nil {
		c.internal(w, r, "create a bulk job", err)
		return
	}
	c.cfg.Logger.Info("console: bulk job started", "job", j.ID, "kind", j.Kind, "total", j.Total, "operator", j.By)
	c.start(j)
	http.Redirect(w, r, fmt.Sprintf("%sbulk/%d", Path, j.ID), http.StatusSeeOther)
}

// resolutionError words an error of Resolution.Validate for the operator.
func resolutionError(err error) error {
	if fe, ok := errors.AsType[*framework.FieldError](err); ok {
		return fmt.Errorf("the %s %s", fe.Field, fe.Reason)
	}
	return err
}

// bulkJob shows a job and its progress.
func (c *Console) bulkJob(w http.ResponseWriter, r *http.Request) {
	c.showJob(w, r, http.StatusOK, "")
}

// showJob renders the page of the job of r's path, with an error.
func (c *Console) showJob(w http.ResponseWriter, r *http.Request, status int, msg string) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 {
		c.fail(w, r, nil, http.StatusBadRequest, fmt.Sprintf("bulk job id %q: want a positive integer", r.PathValue("id")))
		return
	}
	if c.jobs == nil {
		c.fail(w, r, nil, http.StatusNotFound, "this service's store keeps no bulk jobs")
		return
	}
	j, err := c.jobs.BulkJob(r.Context(), id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		c.fail(w, r, nil, http.StatusNotFound, fmt.Sprintf("bulk job %d: not found", id))
		return
	case err != nil:
		c.internal(w, r, fmt.Sprintf("bulk job %d", id), err)
		return
	}
	d := bulkJobData{Job: j, Error: msg, Percent: 100}
	if j.Total > 0 {
		d.Percent = int(min(100, (j.Done+j.Refused)*100/j.Total))
	}
	c.render(w, r, status, "bulkjob", d)
}

// bulkCancel cancels a running or interrupted job: its runner stops
// before its next dead letter.
func (c *Console) bulkCancel(w http.ResponseWriter, r *http.Request) {
	c.bulkAct(w, r, "cancel", "cancelled", func(ctx context.Context, id int64) error {
		if err := c.jobs.CancelBulkJob(ctx, id); err != nil {
			return err
		}
		c.mu.Lock()
		stop := c.running[id]
		c.mu.Unlock()
		if stop != nil {
			stop() // this process runs it: at once, rather than at its next heartbeat
		}
		return nil
	})
}

// bulkResume takes an interrupted job over and runs it in this process,
// after the last dead letter it handled.
func (c *Console) bulkResume(w http.ResponseWriter, r *http.Request) {
	c.bulkAct(w, r, "resume", "resumed", func(ctx context.Context, id int64) error {
		j, err := c.jobs.ResumeBulkJob(ctx, id, c.owner)
		if err == nil {
			c.start(j)
		}
		return err
	})
}

// bulkAct does what to the job of r's path and shows it.
func (c *Console) bulkAct(w http.ResponseWriter, r *http.Request, what, done string, do func(ctx context.Context, id int64) error) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id < 1 || c.jobs == nil {
		c.showJob(w, r, http.StatusBadRequest, "")
		return
	}
	err = do(r.Context(), id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		c.fail(w, r, nil, http.StatusNotFound, fmt.Sprintf("bulk job %d: not found", id))
		return
	case errors.Is(err, driver.ErrBulkJobEnded), errors.Is(err, driver.ErrBulkJobNotInterrupted):
		c.showJob(w, r, http.StatusConflict, fmt.Sprintf("Not %s: %s.", done, errors.Unwrap(err)))
		return
	case err != nil:
		c.internal(w, r, fmt.Sprintf("%s bulk job %d", what, id), err)
		return
	}
	c.cfg.Logger.Info("console: bulk job "+what, "job", id, "operator", operatorOf(r).token.Name)
	http.Redirect(w, r, fmt.Sprintf("%sbulk/%d", Path, id), http.StatusSeeOther)
}

// start runs j in this process until it ends, it is cancelled, or Close.
func (c *Console) start(j driver.BulkJob) {
	ctx, cancel := context.WithCancel(c.ctx)
	c.mu.Lock()
	c.running[j.ID] = cancel
	c.mu.Unlock()
	c.wg.Go(func() {
		defer func() {
			c.mu.Lock()
			delete(c.running, j.ID)
			c.mu.Unlock()
			cancel()
		}()
		c.run(ctx, cancel, j)
	})
}

// Close stops the bulk jobs this console runs and waits for them: each
// stays running in the database, and reads as interrupted once its
// heartbeat is stale (driver.BulkJobStale), to be resumed.
func (c *Console) Close() {
	c.stop()
	c.wg.Wait()
}
