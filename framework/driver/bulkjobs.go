package driver

import (
	"context"
	"errors"
	"time"
)

// BulkJobs is implemented by a Store that records the operator console's
// bulk jobs: a replay or discard of the pending dead letters a filter
// selects, run by the process that took the request, which records its
// progress and heartbeat as it goes. sqlite.Store and postgres.Store
// implement it; times are the database's own.
type BulkJobs interface {
	// CreateBulkJob records j as running, owned by j.Owner, and returns it
	// as recorded: its ID and times set, its progress zero but Total.
	CreateBulkJob(ctx context.Context, j BulkJob) (BulkJob, error)
	// BulkJob returns the job id, or ErrNotFound.
	BulkJob(ctx context.Context, id int64) (BulkJob, error)
	// ListBulkJobs returns the latest limit jobs, newest first.
	ListBulkJobs(ctx context.Context, limit int) ([]BulkJob, error)
	// ProgressBulkJob records p and a heartbeat of the job id while owner
	// owns it, and returns the job's status: BulkJobCancelled tells the
	// runner to stop. It returns ErrBulkJobLost when owner no longer owns
	// it (another process resumed it).
	ProgressBulkJob(ctx context.Context, id int64, owner string, p BulkJobProgress) (BulkJobStatus, error)
	// EndBulkJob records p and moves the running job id of owner to
	// status (BulkJobDone or BulkJobInterrupted); a job cancelled since
	// stays cancelled.
	EndBulkJob(ctx context.Context, id int64, owner string, p BulkJobProgress, status BulkJobStatus) error
	// CancelBulkJob cancels the job id when it is running or interrupted.
	// It returns ErrNotFound, or ErrBulkJobEnded when it is done or
	// cancelled already.
	CancelBulkJob(ctx context.Context, id int64) error
	// ResumeBulkJob gives the interrupted job id to owner, running again,
	// and returns it. It returns ErrNotFound, or ErrBulkJobNotInterrupted
	// when it is not interrupted (its process still runs it, or it ended).
	ResumeBulkJob(ctx context.Context, id int64, owner string) (BulkJob, error)
}

// BulkJobStale is how long a running bulk job's heartbeat may be silent
// before it reads as interrupted: its process stopped or crashed. Runners
// heartbeat several times within it.
const BulkJobStale = 30 * time.Second

// BulkJobKind is what a bulk job does to each dead letter.
type BulkJobKind string

// The kinds of bulk jobs.
const (
	BulkReplay  BulkJobKind = "replay"
	BulkDiscard BulkJobKind = "discard"
)

// BulkJobStatus is the state of a bulk job.
type BulkJobStatus string

// The states of a bulk job. A running job whose heartbeat is older than
// BulkJobStale reads as interrupted.
const (
	BulkJobRunning     BulkJobStatus = "running"
	BulkJobDone        BulkJobStatus = "done"
	BulkJobCancelled   BulkJobStatus = "cancelled"
	BulkJobInterrupted BulkJobStatus = "interrupted"
)

// BulkJob is a replay or discard of the pending dead letters that Filter
// selects (its Consumer, Code, FailedSince and FailedBefore), in the
// order of their ids.
type BulkJob struct {
	ID     int64
	Kind   BulkJobKind
	Filter DeadLetterFilter
	// Rate is the most dead letters it handles a second; 0: no limit.
	Rate float64
	// Reason and By are recorded in each dead letter's history.
	Reason string
	By     string
	Status BulkJobStatus
	BulkJobProgress
	// Total is how many dead letters the filter selected when it started.
	Total int64
	// Owner is the process that runs it.
	Owner string
	// HeartbeatAt is when its owner last said it runs it.
	HeartbeatAt time.Time
	CreatedAt   time.Time
	UpdatedAt   time.Time
}

// BulkJobProgress is how far a bulk job went.
type BulkJobProgress struct {
	// Done counts the dead letters replayed or discarded, Refused those
	// refused (not pending any more, or refused a replay).
	Done    int64
	Refused int64
	// LastID is the last dead letter handled: the job goes on after it.
	LastID int64
}

// ErrBulkJobLost is returned by BulkJobs.ProgressBulkJob when another
// process owns the job now.
var ErrBulkJobLost = errors.New("another process runs the bulk job now")

// ErrBulkJobEnded is returned by BulkJobs.CancelBulkJob for a job that is
// done or cancelled.
var ErrBulkJobEnded = errors.New("the bulk job ended")

// ErrBulkJobNotInterrupted is returned by BulkJobs.ResumeBulkJob for a
// job that is not interrupted.
var ErrBulkJobNotInterrupted = errors.New("the bulk job is not interrupted")
