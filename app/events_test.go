package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/app"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/framework/outbox"
	"github.com/effectively-once/effectively/handlers"
	"github.com/effectively-once/effectively/middleware"
)

// TestInspectCommands runs a service on SQLite and on PostgreSQL whose
// outbox produces two events of one subject; one consumer applies them,
// another (under strict_order) dead-letters the first and parks the
// second behind it, a third runs without deduplication. events show
// answers for each event what happened to it, in text and JSON, and once
// the marks are purged says how far; consumers lists every consumer with
// its settings and figures. It sets the environment, so it does not run
// in parallel.
func TestInspectCommands(t *testing.T) {
	for _, tc := range transportConfigs[:2] {
		t.Run(tc.name, func(t *testing.T) { testInspectCommands(t, tc.config(t)) })
	}
}

func testInspectCommands(t *testing.T, cfg app.Config) {
	const (
		applier = "widgets.apply"
		picky   = "widgets.picky"
		indexer = "widgets.index"
		why     = "the index write is an upsert"
	)
	ctx := context.Background()
	declared := fx.Options(
		handlers.Register(applier, handlers.On(widgetAdded, func(context.Context, framework.Event[widgetAddedV1]) error {
			return nil
		})),
		handlers.Register(picky, handlers.On(widgetAdded, func(context.Context, framework.Event[widgetAddedV1]) error {
			return framework.Permanent("widget_rejected", errors.New("not today"))
		})),
		handlers.Register(indexer, handlers.WithoutDedup(why), handlers.On(widgetAdded, func(context.Context, framework.Event[widgetAddedV1]) error {
			return nil
		})),
	)
	cfg.Consumers = map[string]middleware.Settings{picky: {Concurrency: 3, BatchSize: 2, StrictOrder: true}}
	var (
		box   *outbox.Outbox
		store driver.Store
	)
	b := &bundle{cfg: cfg}
	b.service = app.New(declared, fx.Replace(cfg), fx.Populate(&b.db, &box, &store))
	b.start(t)
	setEnv(t, cfg)
	file := filepath.Join(t.TempDir(), "config.yaml")
	require.NoError(t, os.WriteFile(file, []byte("consumers:\n  "+picky+":\n    concurrency: 3\n    batch_size: 2\n    strict_order: true\n"), 0o600))
	t.Setenv(app.EnvConfig, file)
	run := func(args ...string) string {
		t.Helper()
		out, err := runCommand(t, declared, args...)
		require.NoError(t, err)
		return out
	}
	count := func(query string, args ...any) int { return b.count(t, b.db.Rebind(query), args...) }

	// The first event of the subject is dead-lettered by picky, which
	// holds the subject; the second is parked behind it.
	for i, id := range []string{"w-1", "w-2"} {
		env, err := widgetAdded.Envelope(widgetAddedV1{Name: id}, framework.Attributes{ID: id, Source: "widgets", Subject: "widget-1", SubjectSeq: int64(i + 1)})
		require.NoError(t, err)
		tx, err := b.db.BeginTxx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, box.AddTx(ctx, tx, env))
		require.NoError(t, tx.Commit())
		waitFor(t, id+" applied and refused", func() bool {
			return count(`SELECT count(*) FROM processed_events WHERE consumer = ? AND event_id = ?`, applier, id) == 1 &&
				count(`SELECT count(*) FROM dead_letters WHERE consumer = ?`, picky)+
					count(`SELECT count(*) FROM parked_events WHERE consumer = ? AND reason = 'parked'`, picky) == i+1
		})
	}
	waitFor(t, "the outbox sent", func() bool { return count(`SELECT count(*) FROM outbox WHERE sent_at IS NULL`) == 0 })
	var dlID int64
	require.NoError(t, b.db.Get(&dlID, b.db.Rebind(`SELECT id FROM dead_letters WHERE consumer = ?`), picky))

	out := run("events", "show", "widgets", "w-1")
	t.Log(out)
	for _, re := range []string{
		`(?m)^event\s+widgets/w-1$`,
		`(?m)^produced\s+outbox row \d+, type widgets\.widget\.added, subject widget-1 #1, created \S+, sent \S+$`,
		`(?m)^applied\s+` + regexp.QuoteMeta(applier) + ` at \S+$`,
		`(?m)^no record\s+widgets\.index \(without deduplication, it keeps no mark: ` + why + `\)$`,
		`(?m)^parked\s+widgets\.picky: a dead letter the later events of subject widget-1 wait behind \(#1\), since \S+$`,
		fmt.Sprintf(`(?m)^dead letter %d of widgets\.picky: pending, code widget_rejected, 1 attempts, 0 repeats, first failed \S+, last failed \S+$`, dlID),
		`(?m)^  \S+\s+failed\s+code widget_rejected, 1 attempts(, delivery \d+)?$`,
	} {
		require.Regexp(t, re, out)
	}
	require.NotContains(t, out, "purged")

	out = run("events", "show", "widgets", "w-2")
	require.Regexp(t, `(?m)^parked\s+widgets\.picky: #2 of subject widget-1, parked until the events before it take effect \(one is a dead letter, or has not arrived\), since \S+$`, out)
	require.NotContains(t, out, "dead letter 1")

	var v struct {
		Source string `json:"source"`
		ID     string `json:"id"`
		Known  bool   `json:"known"`
		Outbox *struct {
			Type string `json:"type"`
			Sent bool   `json:"sent"`
		} `json:"outbox"`
		Applied []struct {
			Consumer string    `json:"consumer"`
			At       time.Time `json:"at"`
		} `json:"applied"`
		ProcessedPurgedBefore *time.Time `json:"processed_purged_before"`
		DeadLetters           []struct {
			ID       int64  `json:"id"`
			Consumer string `json:"consumer"`
			Code     string `json:"code"`
			Status   string `json:"status"`
			History  []struct {
				Kind       string `json:"kind"`
				Deliveries int    `json:"deliveries"`
			} `json:"history"`
		} `json:"dead_letters"`
		Parked []struct {
			Consumer string `json:"consumer"`
			Held     bool   `json:"held"`
		} `json:"parked"`
		Unmarked []struct {
			Consumer     string `json:"consumer"`
			WithoutDedup string `json:"without_dedup"`
		} `json:"unmarked"`
	}
	require.NoError(t, json.Unmarshal([]byte(run("events", "show", "widgets", "w-1", "--json")), &v))
	require.Equal(t, "widgets", v.Source)
	require.Equal(t, "w-1", v.ID)
	require.True(t, v.Known)
	require.NotNil(t, v.Outbox)
	require.Equal(t, widgetAdded.Type(), v.Outbox.Type)
	require.True(t, v.Outbox.Sent)
	require.Len(t, v.Applied, 1)
	require.Equal(t, applier, v.Applied[0].Consumer)
	require.Len(t, v.DeadLetters, 1)
	require.Equal(t, dlID, v.DeadLetters[0].ID)
	require.Equal(t, "widget_rejected", v.DeadLetters[0].Code)
	require.Equal(t, "pending", v.DeadLetters[0].Status)
	require.Len(t, v.DeadLetters[0].History, 1)
	require.Equal(t, "failed", v.DeadLetters[0].History[0].Kind)
	require.Len(t, v.Parked, 1)
	require.True(t, v.Parked[0].Held)
	require.Len(t, v.Unmarked, 1)
	require.Equal(t, indexer, v.Unmarked[0].Consumer)
	require.Equal(t, why, v.Unmarked[0].WithoutDedup)
	require.Nil(t, v.ProcessedPurgedBefore)

	require.Equal(t, "no record of event widgets/w-3 in this service's database\n", run("events", "show", "widgets", "w-3"))

	out = run("consumers")
	t.Log(out)
	sub := cfg.Transport + " group "
	for _, re := range []string{
		`(?m)^CONSUMER\s+TYPES\s+SUBSCRIPTION\s+CONCURRENCY\s+BATCH\s+DEDUP\s+PROCESSED 1H\s+PENDING DL\s+PARKED\s+WAITING\s+OLDEST$`,
		fmt.Sprintf(`(?m)^%s\s+widgets\.widget\.added\s+%s%s\s+%d\s+%d\s+on\s+2\s+0\s+0\s+0\s+-$`,
			regexp.QuoteMeta(applier), sub, regexp.QuoteMeta(applier), cfg.Settings(applier).Concurrency, driver.DefaultBatchSize),
		`(?m)^widgets\.index\s+widgets\.widget\.added\s+` + sub + `widgets\.index\s+\d+\s+\d+\s+off: ` + why + `\s+-\s+0\s+0\s+\S+\s+\S+$`,
		`(?m)^widgets\.picky\s+widgets\.widget\.added\s+` + sub + `widgets\.picky\s+3\s+2\s+on\s+0\s+1\s+1\s+\S+\s+\S+$`,
		`(?m)^outbox: no unsent row$`,
	} {
		require.Regexp(t, re, out)
	}
	var cv struct {
		Consumers []struct {
			Name               string   `json:"name"`
			Types              []string `json:"types"`
			ConsumerGroup      string   `json:"consumer_group"`
			Concurrency        int      `json:"concurrency"`
			Dedup              bool     `json:"dedup"`
			ProcessedLastHour  int64    `json:"processed_last_hour"`
			PendingDeadLetters int64    `json:"pending_dead_letters"`
			Parked             int64    `json:"parked"`
			Lag                *struct {
				Waiting       int64    `json:"waiting"`
				OldestSeconds *float64 `json:"oldest_seconds"`
			} `json:"lag"`
		} `json:"consumers"`
	}
	require.NoError(t, json.Unmarshal([]byte(run("consumers", "--json")), &cv))
	require.Len(t, cv.Consumers, 3)
	require.Equal(t, picky, cv.Consumers[2].Name)
	require.Equal(t, []string{widgetAdded.Type()}, cv.Consumers[2].Types)
	require.Equal(t, picky, cv.Consumers[2].ConsumerGroup)
	require.Equal(t, 3, cv.Consumers[2].Concurrency)
	require.EqualValues(t, 1, cv.Consumers[2].PendingDeadLetters)
	require.EqualValues(t, 1, cv.Consumers[2].Parked)
	require.EqualValues(t, 2, cv.Consumers[0].ProcessedLastHour)
	require.NotNil(t, cv.Consumers[0].Lag, "what waits, counted by the transport")
	require.Zero(t, cv.Consumers[0].Lag.Waiting)
	require.NotNil(t, cv.Consumers[0].Lag.OldestSeconds, "a SQL transport ages what waits")

	// The retention purges the marks: events show says how far.
	before := time.Now().Add(time.Second)
	n, err := store.PurgeProcessed(ctx, before, 1000)
	require.NoError(t, err)
	require.EqualValues(t, 2, n)
	stamp := regexp.QuoteMeta(before.UTC().Format(time.RFC3339Nano))
	if cfg.Transport == app.TransportPostgres {
		stamp = regexp.QuoteMeta(before.UTC().Truncate(time.Microsecond).Format(time.RFC3339Nano))
	}
	out = run("events", "show", "widgets", "w-1")
	require.NotRegexp(t, `(?m)^applied`, out)
	require.Regexp(t, `(?m)^no record\s+`+regexp.QuoteMeta(applier)+` \(not applied yet, or its mark purged\)$`, out)
	require.Regexp(t, `(?m)^purged\s+marks processed before `+stamp+`$`, out)
	out = run("events", "show", "widgets", "w-3")
	require.Contains(t, out, "no record of event widgets/w-3")
	require.Regexp(t, `(?m)^marks processed before `+stamp+` are purged: a consumer may have applied it before$`, out)
}
