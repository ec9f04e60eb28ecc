package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/jmoiron/sqlx"

	"github.com/effectively-once/effectively/app/testkit"
	"github.com/effectively-once/effectively/examples/notifications/appointments"
	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// The service of the partition tests (see partitions_test.go): several
// processes of one partitioned strict_order consumer, whose handler
// records each effect with the process that committed it and whether the
// event's predecessor had taken effect, and whose hook stops or kills
// the process at one crash point once the test arms it.
const (
	// envOrderCheck, when set, makes the consumer of envCrashConsumer
	// run newOrderedRemind instead of NewRemindOnBooked.
	envOrderCheck = "EFFECTIVELY_ORDER_CHECK"
	// modeArmed does nothing until the file named by envArm holds an
	// armOrder; then the first delivery of the order's partitions that
	// reaches its point stops the process (SIGSTOP: it goes on where it
	// stopped once continued) or kills it (SIGKILL), once, after
	// reporting it in the file armFired names.
	modeArmed = "armed"
	envArm    = "EFFECTIVELY_ARM"
)

// The actions of an armOrder.
const (
	armStop = "stop"
	armKill = "kill"
)

// armOrder is what the test writes to the file of envArm.
type armOrder struct {
	At     testkit.CrashPoint `json:"at"`
	Action string             `json:"action"`
	// Partitions are the partitions whose deliveries may fire; any when
	// empty.
	Partitions []int `json:"partitions"`
}

// armReport is what the hook writes before it fires.
type armReport struct {
	At        testkit.CrashPoint `json:"at"`
	Event     string             `json:"event"`
	Partition int                `json:"partition"`
}

// armFired names the report of the hook armed by the file arm.
func armFired(arm string) string { return arm + ".fired" }

// armedHookOf returns the hook of modeArmed; ok is false for another
// mode.
func armedHookOf(mode string) (hook testkit.CrashHook, ok bool, err error) {
	if mode != modeArmed {
		return nil, false, nil
	}
	path := os.Getenv(envArm)
	if path == "" {
		return nil, true, fmt.Errorf("%s: mode %s needs %s", envCrashMode, modeArmed, envArm)
	}
	return armedHook(path), true, nil
}

// armedHook returns the hook of modeArmed, armed by the file path.
func armedHook(path string) testkit.CrashHook {
	var (
		mu    sync.Mutex
		order *armOrder
		fired atomic.Bool
	)
	armed := func() *armOrder {
		mu.Lock()
		defer mu.Unlock()
		if order == nil {
			raw, err := os.ReadFile(path)
			var o armOrder
			if err == nil && json.Unmarshal(raw, &o) == nil { // the test writes it whole (a rename)
				order = &o
			}
		}
		return order
	}
	return func(ctx context.Context, p testkit.CrashPoint) bool {
		if fired.Load() {
			return false
		}
		o := armed()
		if o == nil || p != o.At {
			return false
		}
		part, ok := driver.PartitionFromContext(ctx)
		if !ok {
			part = -1
		}
		if len(o.Partitions) > 0 && !slices.Contains(o.Partitions, part) {
			return false
		}
		if !fired.CompareAndSwap(false, true) {
			return false
		}
		raw, err := json.Marshal(armReport{At: p, Event: eventID(ctx), Partition: part})
		if err == nil {
			err = writeWhole(armFired(path), raw)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "notifications: arm report: %v\n", err)
			os.Exit(3)
		}
		switch o.Action {
		case armStop:
			stopSelf()
		case armKill:
			killSelf()
		}
		return false
	}
}

// stopSelf stops the process with SIGSTOP and returns once it is
// continued (SIGCONT). The kernel stops the process when one of its
// threads takes the signal, not always the caller's, which may run on
// meanwhile: the caller waits for SIGCONT, so that it goes no step
// further before the stop.
func stopSelf() {
	cont := make(chan os.Signal, 1)
	signal.Notify(cont, syscall.SIGCONT)
	defer signal.Stop(cont)
	_ = syscall.Kill(os.Getpid(), syscall.SIGSTOP)
	<-cont
}

// writeWhole writes raw to path through a rename, so that a reader sees
// all of it or nothing.
func writeWhole(path string, raw []byte) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// orderEffectsTable is the partition tests' own table, which the test
// creates: a row per effect committed by newOrderedRemind, numbered in
// the order of the inserts.
const orderEffectsTable = `CREATE TABLE order_effects (
	n         bigserial PRIMARY KEY,
	event_id  text NOT NULL,
	subject   text NOT NULL,
	seq       bigint NOT NULL,
	partition integer NOT NULL,
	pid       integer NOT NULL,
	prev_seen boolean NOT NULL,
	at        timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// newOrderedRemind returns NewRemindOnBooked's handler, which also
// records the effect in order_effects, in the attempt's transaction:
// the event's subject, sequence and partition, the process, and whether
// the effect of its predecessor (the subject's event before it) was
// there to see.
func newOrderedRemind(db *sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
	remind := NewRemindOnBooked(db)
	pid := os.Getpid()
	before := db.Rebind(`SELECT count(*) FROM order_effects WHERE subject = ? AND seq = ?`)
	insert := db.Rebind(`INSERT INTO order_effects (event_id, subject, seq, partition, pid, prev_seen) VALUES (?, ?, ?, ?, ?, ?)`)
	return func(ctx context.Context, ev framework.Event[appointments.BookedV1]) error {
		if ev.Subject == "" || ev.SubjectSeq < 1 {
			return framework.Permanent("no_sequence", errors.New("the partition tests' events have a subject and a sequence"))
		}
		if err := remind(ctx, ev); err != nil {
			return err
		}
		conn := framework.Conn(ctx, db)
		seen := true
		if ev.SubjectSeq > 1 {
			var n int
			if err := conn.QueryRowxContext(ctx, before, ev.Subject, ev.SubjectSeq-1).Scan(&n); err != nil {
				return fmt.Errorf("read the effect before %s: %w", ev.ID, err)
			}
			seen = n > 0
		}
		part, ok := driver.PartitionFromContext(ctx)
		if !ok {
			part = -1
		}
		if _, err := conn.ExecContext(ctx, insert, ev.ID, ev.Subject, ev.SubjectSeq, part, pid, seen); err != nil {
			return fmt.Errorf("record the effect of %s: %w", ev.ID, err)
		}
		return nil
	}
}

// remindHandler returns the handler of the consumer of envCrashConsumer.
func remindHandler() func(*sqlx.DB) framework.HandlerFunc[appointments.BookedV1] {
	if os.Getenv(envOrderCheck) != "" {
		return newOrderedRemind
	}
	return NewRemindOnBooked
}
