package postgres

import (
	"context"

	"github.com/effectively-once/effectively/framework/driver"
)

var _ driver.BulkJobs = (*Store)(nil)

// CreateBulkJob records j as running, owned by j.Owner, and returns it
// as recorded (driver.BulkJobs).
func (s *Store) CreateBulkJob(ctx context.Context, j driver.BulkJob) (driver.BulkJob, error) {
	return s.sql.CreateBulkJob(ctx, j)
}

// BulkJob returns the bulk job id, or driver.ErrNotFound
// (driver.BulkJobs).
func (s *Store) BulkJob(ctx context.Context, id int64) (driver.BulkJob, error) {
	return s.sql.BulkJob(ctx, id)
}

// ListBulkJobs returns the latest limit bulk jobs, newest first
// (driver.BulkJobs).
func (s *Store) ListBulkJobs(ctx context.Context, limit int) ([]driver.BulkJob, error) {
	return s.sql.ListBulkJobs(ctx, limit)
}

// ProgressBulkJob records p and a heartbeat of the job id while owner
// owns it, and returns its status (driver.BulkJobs).
func (s *Store) ProgressBulkJob(ctx context.Context, id int64, owner string, p driver.BulkJobProgress) (driver.BulkJobStatus, error) {
	return s.sql.ProgressBulkJob(ctx, id, owner, p)
}

// EndBulkJob records p and moves the running job id of owner to status
// (driver.BulkJobs).
func (s *Store) EndBulkJob(ctx context.Context, id int64, owner string, p driver.BulkJobProgress, status driver.BulkJobStatus) error {
	return s.sql.EndBulkJob(ctx, id, owner, p, status)
}

// CancelBulkJob cancels the running or interrupted job id
// (driver.BulkJobs).
func (s *Store) CancelBulkJob(ctx context.Context, id int64) error {
	return s.sql.CancelBulkJob(ctx, id)
}

// ResumeBulkJob gives the interrupted job id to owner, running again
// (driver.BulkJobs).
func (s *Store) ResumeBulkJob(ctx context.Context, id int64, owner string) (driver.BulkJob, error) {
	return s.sql.ResumeBulkJob(ctx, id, owner)
}
