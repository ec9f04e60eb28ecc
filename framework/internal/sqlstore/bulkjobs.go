package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The SQL of the console's bulk jobs (driver.BulkJobs). "{now}" is the
// database's time (see leaseTime), "{stale}" the database's time less an
// argument, driver.BulkJobStale: a running job whose heartbeat is older
// reads as interrupted.
const (
	qBulkJobColumns = `id, kind, filter, rate, reason, by_name,
CASE WHEN status = 'running' AND heartbeat_at < {stale} THEN 'interrupted' ELSE status END,
done, refused, total, last_id, owner, heartbeat_at, created_at, updated_at`
	qCreateBulkJob = `INSERT INTO {p}bulk_jobs (kind, filter, rate, reason, by_name, status, total, owner, heartbeat_at, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, 'running', ?, ?, {now}, {now}, {now}) RETURNING id`
	qBulkJob       = `SELECT ` + qBulkJobColumns + ` FROM {p}bulk_jobs WHERE id = ?`
	qListBulkJobs  = `SELECT ` + qBulkJobColumns + ` FROM {p}bulk_jobs ORDER BY id DESC LIMIT ?`
	qBulkJobStatus = `SELECT status FROM {p}bulk_jobs WHERE id = ?`
	// qProgressBulkJob records a runner's progress and heartbeat while it
	// owns the job, and returns the job's status (a cancel shows there).
	qProgressBulkJob = `UPDATE {p}bulk_jobs SET done = ?, refused = ?, last_id = ?, heartbeat_at = {now}, updated_at = {now}
WHERE id = ? AND owner = ? RETURNING status`
	// qEndBulkJob keeps a job cancelled since as it is.
	qEndBulkJob = `UPDATE {p}bulk_jobs SET done = ?, refused = ?, last_id = ?, updated_at = {now},
status = CASE WHEN status = 'running' THEN ? ELSE status END
WHERE id = ? AND owner = ?`
	qCancelBulkJob = `UPDATE {p}bulk_jobs SET status = 'cancelled', updated_at = {now}
WHERE id = ? AND status IN ('running', 'interrupted')`
	// qResumeBulkJob takes an interrupted job: one that ended on an error,
	// or whose runner's heartbeat is stale. Of two resumes at once, the
	// second finds the first's fresh heartbeat and takes nothing.
	qResumeBulkJob = `UPDATE {p}bulk_jobs SET owner = ?, status = 'running', heartbeat_at = {now}, updated_at = {now}
WHERE id = ? AND (status = 'interrupted' OR (status = 'running' AND heartbeat_at < {stale}))`
)

var _ driver.BulkJobs = (*Store)(nil)

// bulkSQL returns a statement of the bulk jobs with the prefix, the
// dialect's placeholders and its time.
func (s *Store) bulkSQL(q string) string {
	now, _ := leaseTime(s.dialect)
	stale := s.dialect.pick(now+` - ?::float8 * interval '1 microsecond'`, now+` - ?`)
	return s.q.sql(strings.NewReplacer("{now}", now, "{stale}", stale).Replace(q))
}

// bulkFilter is the filter of a bulk job as its row keeps it, in JSON.
type bulkFilter struct {
	Consumer string    `json:"consumer,omitempty"`
	Code     string    `json:"code,omitempty"`
	Since    time.Time `json:"since,omitzero"`
	Until    time.Time `json:"until,omitzero"`
}

// CreateBulkJob implements driver.BulkJobs.
func (s *Store) CreateBulkJob(ctx context.Context, j driver.BulkJob) (driver.BulkJob, error) {
	filter, err := json.Marshal(bulkFilter{Consumer: j.Filter.Consumer, Code: string(j.Filter.Code), Since: j.Filter.FailedSince, Until: j.Filter.FailedBefore})
	if err != nil {
		return driver.BulkJob{}, fmt.Errorf("create bulk job: %w", err)
	}
	var id int64
	if err := s.db.QueryRowContext(ctx, s.bulkSQL(qCreateBulkJob),
		string(j.Kind), string(filter), j.Rate, j.Reason, j.By, j.Total, j.Owner).Scan(&id); err != nil {
		return driver.BulkJob{}, fmt.Errorf("create bulk job: %w", err)
	}
	return s.BulkJob(ctx, id)
}

// BulkJob implements driver.BulkJobs.
func (s *Store) BulkJob(ctx context.Context, id int64) (driver.BulkJob, error) {
	rows, err := s.db.QueryContext(ctx, s.bulkSQL(qBulkJob), s.dialect.ttlArg(driver.BulkJobStale), id)
	if err != nil {
		return driver.BulkJob{}, fmt.Errorf("bulk job %d: %w", id, err)
	}
	jobs, err := scanBulkJobs(rows)
	switch {
	case err != nil:
		return driver.BulkJob{}, fmt.Errorf("bulk job %d: %w", id, err)
	case len(jobs) == 0:
		return driver.BulkJob{}, fmt.Errorf("bulk job %d: %w", id, driver.ErrNotFound)
	}
	return jobs[0], nil
}

// ListBulkJobs implements driver.BulkJobs.
func (s *Store) ListBulkJobs(ctx context.Context, limit int) ([]driver.BulkJob, error) {
	rows, err := s.db.QueryContext(ctx, s.bulkSQL(qListBulkJobs), s.dialect.ttlArg(driver.BulkJobStale), limit)
	if err != nil {
		return nil, fmt.Errorf("list bulk jobs: %w", err)
	}
	jobs, err := scanBulkJobs(rows)
	if err != nil {
		return nil, fmt.Errorf("list bulk jobs: %w", err)
	}
	return jobs, nil
}

// scanBulkJobs reads the rows of qBulkJobColumns and closes them.
func scanBulkJobs(rows *sql.Rows) ([]driver.BulkJob, error) {
	defer rows.Close()
	var jobs []driver.BulkJob
	for rows.Next() {
		var (
			j                       driver.BulkJob
			filter                  string
			heartbeat, created, upd timeValue
			f                       bulkFilter
		)
		if err := rows.Scan(&j.ID, &j.Kind, &filter, &j.Rate, &j.Reason, &j.By, &j.Status,
			&j.Done, &j.Refused, &j.Total, &j.LastID, &j.Owner, &heartbeat, &created, &upd); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(filter), &f); err != nil {
			return nil, fmt.Errorf("bulk job %d: filter: %w", j.ID, err)
		}
		j.Filter = driver.DeadLetterFilter{Consumer: f.Consumer, Code: framework.Code(f.Code), FailedSince: f.Since, FailedBefore: f.Until}
		j.HeartbeatAt, j.CreatedAt, j.UpdatedAt = heartbeat.t, created.t, upd.t
		jobs = append(jobs, j)
	}
	return jobs, rows.Err()
}

// ProgressBulkJob implements driver.BulkJobs.
func (s *Store) ProgressBulkJob(ctx context.Context, id int64, owner string, p driver.BulkJobProgress) (driver.BulkJobStatus, error) {
	var status driver.BulkJobStatus
	err := s.db.QueryRowContext(ctx, s.bulkSQL(qProgressBulkJob), p.Done, p.Refused, p.LastID, id, owner).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", fmt.Errorf("bulk job %d: %w", id, driver.ErrBulkJobLost)
	case err != nil:
		return "", fmt.Errorf("bulk job %d: progress: %w", id, err)
	}
	return status, nil
}

// EndBulkJob implements driver.BulkJobs.
func (s *Store) EndBulkJob(ctx context.Context, id int64, owner string, p driver.BulkJobProgress, status driver.BulkJobStatus) error {
	res, err := s.exec(ctx, s.bulkSQL(qEndBulkJob), p.Done, p.Refused, p.LastID, string(status), id, owner)
	if err != nil {
		return fmt.Errorf("bulk job %d: end: %w", id, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("bulk job %d: %w", id, driver.ErrBulkJobLost)
	}
	return nil
}

// CancelBulkJob implements driver.BulkJobs.
func (s *Store) CancelBulkJob(ctx context.Context, id int64) error {
	res, err := s.exec(ctx, s.bulkSQL(qCancelBulkJob), id)
	if err != nil {
		return fmt.Errorf("cancel bulk job %d: %w", id, err)
	}
	return s.bulkJobChanged(ctx, id, res, driver.ErrBulkJobEnded)
}

// ResumeBulkJob implements driver.BulkJobs.
func (s *Store) ResumeBulkJob(ctx context.Context, id int64, owner string) (driver.BulkJob, error) {
	res, err := s.exec(ctx, s.bulkSQL(qResumeBulkJob), owner, id, s.dialect.ttlArg(driver.BulkJobStale))
	if err != nil {
		return driver.BulkJob{}, fmt.Errorf("resume bulk job %d: %w", id, err)
	}
	if err := s.bulkJobChanged(ctx, id, res, driver.ErrBulkJobNotInterrupted); err != nil {
		return driver.BulkJob{}, err
	}
	return s.BulkJob(ctx, id)
}

// bulkJobChanged returns nil when res changed the job id, else
// ErrNotFound when there is none, else unchanged.
func (s *Store) bulkJobChanged(ctx context.Context, id int64, res sql.Result, unchanged error) error {
	n, err := res.RowsAffected()
	if err != nil {
		return fmt.Errorf("bulk job %d: %w", id, err)
	}
	if n > 0 {
		return nil
	}
	var status string
	err = s.db.QueryRowContext(ctx, s.bulkSQL(qBulkJobStatus), id).Scan(&status)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return fmt.Errorf("bulk job %d: %w", id, driver.ErrNotFound)
	case err != nil:
		return fmt.Errorf("bulk job %d: %w", id, err)
	}
	return fmt.Errorf("bulk job %d (%s): %w", id, status, unchanged)
}
