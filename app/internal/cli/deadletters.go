package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/user"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/framework/driver"
)

// deadLettersCommand returns the operator's commands on dead letters.
func deadLettersCommand(s Service) *cobra.Command {
	root := &cobra.Command{
		Use:     "dead-letters",
		Aliases: []string{"dl"},
		Short:   "Inspect, replay and discard the messages consumers gave up on",
	}

	var (
		filter    driver.DeadLetterFilter
		status    string
		codeFlag  string
		showLimit int
		raw       bool
	)
	list := &cobra.Command{
		Use:   "list",
		Short: "List dead letters, oldest first",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch status {
			case "all":
				filter.Status = ""
			case string(driver.DeadLetterPending), string(driver.DeadLetterReplayed), string(driver.DeadLetterDiscarded):
				filter.Status = driver.DeadLetterStatus(status)
			default:
				return fmt.Errorf("--status: want pending, replayed, discarded or all, got %q", status)
			}
			switch {
			case showLimit < 1:
				return fmt.Errorf("--limit: want 1 or more, got %d", showLimit)
			case filter.AfterID < 0:
				return fmt.Errorf("--after: want an id, 0 or more, got %d", filter.AfterID)
			}
			filter.Code = framework.Code(codeFlag)
			filter.Limit = showLimit
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				op.noteUndeclared(cmd.ErrOrStderr(), filter.Consumer)
				dls, err := op.deadLetters.DeadLetters(ctx, filter)
				if err != nil {
					return err
				}
				return printList(cmd.OutOrStdout(), dls)
			})
		},
	}
	list.Flags().StringVar(&filter.Consumer, "consumer", "", "only this consumer's")
	list.Flags().StringVar(&codeFlag, "code", "", "only those with this code")
	list.Flags().StringVar(&status, "status", string(driver.DeadLetterPending), "pending, replayed, discarded or all")
	list.Flags().Int64Var(&filter.AfterID, "after", 0, "only those with a greater id (paging)")
	list.Flags().IntVar(&showLimit, "limit", 100, "at most this many")

	show := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its original message and its history",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, err := parseID(args[0])
			if err != nil {
				return err
			}
			return operate(cmd.Context(), s, func(ctx context.Context, op operator) error {
				dl, err := op.deadLetters.DeadLetter(ctx, id)
				if errors.Is(err, driver.ErrNotFound) {
					return fmt.Errorf("dead letter %d: %w", id, driver.ErrNotFound)
				}
				if err != nil {
					return err // the store's error names the dead letter
				}
				if raw {
					_, err := cmd.OutOrStdout().Write(dl.Body)
					return err
				}
				if err := printDeadLetter(cmd.OutOrStdout(), dl); err != nil {
					return err
				}
				history, err := op.deadLetters.DeadLetterHistory(ctx, id)
				if err != nil {
					return fmt.Errorf("dead letter %d: history: %w", id, err)
				}
				if err := printHistory(cmd.OutOrStdout(), history); err != nil {
					return err
				}
				return op.reportParked(ctx, cmd.OutOrStdout(), dl, "listed by dead-letters parked --subject "+dl.Subject)
			})
		},
	}

	show.Flags().BoolVar(&raw, "raw", false, "write the message's body only, its exact bytes (escaped otherwise)")

	root.AddCommand(list, show, replayCommand(s), discardCommand(s), parkedCommand(s))
	return root
}

// resolutionFlags adds the flags that say who resolves dead letters and
// why, both recorded in their history.
func resolutionFlags(cmd *cobra.Command, r *driver.Resolution) {
	cmd.Flags().StringVar(&r.By, "by", defaultActor(), "who does it (recorded; defaults to $USER, else the OS user)")
	cmd.Flags().StringVar(&r.Reason, "reason", "", "why (recorded; required)")
}

// defaultActor is who resolves dead letters when --by is not given:
// $USER, else the user the process runs as (a container or a CI job often
// has no $USER), else "" (checkResolution then asks for --by).
func defaultActor() string {
	if name := os.Getenv("USER"); name != "" {
		return name
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return ""
}

// checkResolution refuses a resolution without an actor or a reason, or
// with one that no store can record (driver.Resolution.Validate); why
// says what the reason should say.
func checkResolution(r driver.Resolution, why string) error {
	switch {
	case strings.TrimSpace(r.Reason) == "":
		return fmt.Errorf("--reason: say %s", why)
	case strings.TrimSpace(r.By) == "":
		return errors.New("--by: say who you are: the name is blank (--by, else $USER, else the OS user)")
	}
	if err := r.Validate(); err != nil {
		if fe, ok := errors.AsType[*framework.FieldError](err); ok {
			return fmt.Errorf("--%s: %s", fe.Field, fe.Reason)
		}
		return err
	}
	return nil
}

func parseID(s string) (int64, error) {
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, fmt.Errorf("dead letter id %q: want a positive integer", s)
	}
	return id, nil
}

// parseIDs returns the ids of args, each once, in their order: a dead
// letter named twice is acted on once, as a dry run says, not refused the
// second time as resolved by the operator himself.
func parseIDs(args []string) ([]int64, error) {
	ids := make([]int64, 0, len(args))
	seen := make(map[int64]bool, len(args))
	for _, a := range args {
		id, err := parseID(a)
		if err != nil {
			return nil, err
		}
		if !seen[id] {
			seen[id] = true
			ids = append(ids, id)
		}
	}
	return ids, nil
}
