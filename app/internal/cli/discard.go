package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
	"github.com/effectively-once/effectively/internal/printable"
)

// discardCommand returns the command that discards dead letters.
func discardCommand(s Service) *cobra.Command {
	var (
		r            driver.Resolution
		releaseAfter bool
	)
	cmd := &cobra.Command{
		Use:   "discard ID...",
		Short: "Mark pending dead letters discarded: never to be processed",
		Long: `Discard marks each pending dead letter discarded: it will never be processed.
Who, when and why are kept in its history. Each dead letter is reported:
discarded, or refused and why (not found; not pending: who resolved it,
when); the command goes on after a refusal and exits non-zero when it
refused any. --reason and --by (default $USER, else the OS user) are required.

Under strict_order, the later events of the dead letter's subject are parked
behind it and stay parked after a discard, until the operator asks for them:
with --release-parked the subject's sequence skips the discarded event, and
its parked events are recorded to hand to the consumer (through its replay
path; the running service publishes them) to be applied in order.
--release-parked also works on a dead letter discarded before; running it
again hands the parked events over again, which the consumer absorbs.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ids, err := parseIDs(args)
			if err != nil {
				return err
			}
			r.Status = driver.DeadLetterDiscarded
			if err := checkResolution(r, "why the messages will never be processed"); err != nil {
				return err
			}
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				vs := make([]verdict, 0, len(ids))
				var errs []error
				for _, id := range ids {
					v, err := op.discard(ctx, cmd.OutOrStdout(), releaseAfter, id, r)
					if err != nil {
						return err
					}
					if v.refused != "" {
						fmt.Fprintln(cmd.OutOrStdout(), v.line(""))
						errs = append(errs, v.err)
					}
					vs = append(vs, v.verdict)
				}
				return refusals(vs, errs)
			})
		},
	}
	cmd.Flags().BoolVar(&releaseAfter, "release-parked", false,
		"skip the discarded event in its subject's sequence and apply the events parked behind it (strict_order)")
	resolutionFlags(cmd, &r)
	return cmd
}

// discarded is the verdict of a discard, with the error behind its
// refusal.
type discarded struct {
	verdict
	err error
}

// discard marks the dead letter id discarded with r (its history keeps
// it), and tells out what becomes of the events parked behind it: they
// stay parked unless release (--release-parked), which skips the dead
// letter in its subject's sequence and records the parked events whose
// turn came as replays to the consumer (Store.AddReplays), which the
// running service publishes. With release, a dead letter discarded before
// is accepted, and out told that this discard is not recorded (its
// history keeps the first). A dead letter that is not found or not
// pending is refused.
func (op operator) discard(ctx context.Context, out io.Writer, release bool, id int64, r driver.Resolution) (discarded, error) {
	refuse := func(why string, err error) (discarded, error) {
		return discarded{verdict: verdict{id: id, refused: why}, err: fmt.Errorf("dead letter %d: %w", id, err)}, nil
	}
	dl, err := op.deadLetters.DeadLetter(ctx, id)
	switch {
	case errors.Is(err, driver.ErrNotFound):
		return refuse("not found", err)
	case err != nil:
		return discarded{}, fmt.Errorf("dead letter %d: %w", id, err)
	case release && dl.Subject != "" && !slices.Contains(op.consumers, dl.Consumer):
		why := fmt.Sprintf("consumer %s is not declared in this service: nothing would apply its parked events", dl.Consumer)
		return refuse(why, errors.New(why))
	}
	again := release && dl.Status == driver.DeadLetterDiscarded
	if !again {
		_, err := op.deadLetters.ResolveDeadLetter(ctx, id, r)
		switch {
		case errors.Is(err, driver.ErrNotPending):
			if dl, err = op.deadLetters.DeadLetter(ctx, id); err != nil {
				return discarded{}, fmt.Errorf("dead letter %d: %w", id, err)
			}
			return refuse(notPending(dl), driver.ErrNotPending)
		case errors.Is(err, driver.ErrNotFound):
			return refuse("not found", err)
		case err != nil:
			return discarded{}, fmt.Errorf("discard dead letter %d: %w", id, err)
		}
	}
	v := discarded{verdict: verdict{id: id, dl: dl}}
	if again {
		// Nothing is recorded of this discard: say so, rather than that it
		// was discarded now with this --by and --reason.
		fmt.Fprintf(out, "dead letter %d was discarded before, by %s at %s (%s): this discard is not recorded\n",
			id, printable.String(orDash(dl.Resolution.By)), dl.Resolution.At.UTC().Format(time.RFC3339), printable.String(dl.Resolution.Reason))
	} else {
		fmt.Fprintf(out, "dead letter %d discarded\n", id)
	}
	if !release {
		return v, op.reportParked(ctx, out, dl, "they stay parked: discard it again with --release-parked to apply them")
	}
	if dl.Subject == "" {
		return v, nil
	}
	return v, op.releaseParked(ctx, out, dl)
}

// releaseParked skips the discarded dl in its subject's sequence and
// records the events parked behind it whose turn came as replays to its
// consumer, in their order.
func (op operator) releaseParked(ctx context.Context, out io.Writer, dl driver.DeadLetter) error {
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil {
		return err
	}
	if _, err := op.deadLetters.Skip(ctx, dl.Consumer, dl.Subject, dl.Key()); err != nil && !errors.Is(err, driver.ErrNotFound) {
		return fmt.Errorf("dead letter %d: skip it in the sequence of %s: %w", dl.ID, dl.Subject, err)
	} // not found: skipped before, or nothing was held behind it
	ready, err := op.deadLetters.Parked(ctx, driver.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject, Ready: true})
	if err != nil {
		return err
	}
	rs := make([]driver.Replay, 0, len(ready))
	for _, p := range ready {
		rs = append(rs, parkedReplay(p))
	}
	if len(rs) > 0 {
		if err := op.deadLetters.AddReplays(ctx, rs); err != nil {
			return fmt.Errorf("dead letter %d: release the events parked behind it: %w", dl.ID, err)
		}
	}
	_, err = fmt.Fprintf(out, "%d events of subject %s parked behind it are released to %s, to be applied in order (the running service publishes them)\n",
		len(parked), printable.String(dl.Subject), dl.Consumer)
	return err
}

// parkedCommand returns the command that lists the events parked behind
// dead letters, per subject.
func parkedCommand(s Service) *cobra.Command {
	var filter driver.ParkedFilter
	cmd := &cobra.Command{
		Use:   "parked",
		Short: "List, per subject, the events parked behind a dead letter (strict_order)",
		Long: `Under strict_order, while an event of a subject is a dead letter, the later
events of that subject are parked behind it: acknowledged, not processed.
Parked lists them per consumer and subject: the sequence and event of the
dead letter they wait behind (HELD), and their sequences. Replaying the dead
letter applies them after it; discarding it with --release-parked applies
them without it. READY counts parked events whose turn has come: the
consumer applies them at its next message.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				op.noteUndeclared(cmd.ErrOrStderr(), filter.Consumer)
				ps, err := op.deadLetters.Parked(ctx, filter)
				if err != nil {
					return err
				}
				return printParked(cmd.OutOrStdout(), ps)
			})
		},
	}
	cmd.Flags().StringVar(&filter.Consumer, "consumer", "", "only this consumer's")
	cmd.Flags().StringVar(&filter.Subject, "subject", "", "only this subject's")
	return cmd
}

// parkedBehind returns the events parked behind dl (see
// driver.ParkedBehind).
func (op operator) parkedBehind(ctx context.Context, dl driver.DeadLetter) ([]driver.ParkedEvent, error) {
	if dl.Subject == "" {
		return nil, nil
	}
	ps, err := op.deadLetters.Parked(ctx, driver.ParkedFilter{Consumer: dl.Consumer, Subject: dl.Subject})
	if err != nil {
		return nil, err
	}
	return driver.ParkedBehind(dl, ps), nil
}

// reportParked tells out how many events are parked behind dl, and what
// becomes of them, when there are any.
func (op operator) reportParked(ctx context.Context, out io.Writer, dl driver.DeadLetter, fate string) error {
	parked, err := op.parkedBehind(ctx, dl)
	if err != nil || len(parked) == 0 {
		return err
	}
	_, err = fmt.Fprintf(out, "%d events of subject %s are parked behind it: %s\n", len(parked), printable.String(dl.Subject), fate)
	return err
}

// parkedReplay is the replay of the parked event p to its consumer: its
// body and metadata, without the transport's redelivery marker.
func parkedReplay(p driver.ParkedEvent) driver.Replay {
	md := make(map[string]string, len(p.Metadata))
	for k, v := range p.Metadata {
		if k != framework.MetadataRedelivered {
			md[k] = v
		}
	}
	return driver.Replay{Consumer: p.Consumer, Topic: p.Topic, Body: p.Body, Metadata: md}
}
