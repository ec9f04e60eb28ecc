package soak

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the figures' queries
)

// Report holds a run's figures.
type Report struct {
	Figures
	// Effects are the effect rows per consumer, and Doubled those of an
	// event that has more than one.
	Effects, Doubled map[string]int
	// DeadLetters counts dead letters by consumer, code and status.
	DeadLetters map[string]int
	// Subjects is how many subjects the projection should hold, Complete
	// how many it holds as expected; Applied is its events applied.
	Subjects, Complete, Applied int
	// Parked, PendingDeadLetters and Unsent must be zero at the end.
	Parked, PendingDeadLetters, Unsent int
	// Kills counts the consumer processes killed; Events lists the
	// other faults with when they happened.
	Kills  int
	Faults []string
	// Took is the run's duration, servers' start excluded.
	Took time.Duration
}

// Check returns what the report shows wrong: every consumer's effects
// equal distinct − poison, each effect once, the projection complete,
// nothing parked, pending or unsent.
func (r Report) Check() error {
	var errs []error
	want := r.Distinct - r.Poison
	for _, c := range []string{EffectsConsumer, ProjectionConsumer} {
		if r.Effects[c] != want {
			errs = append(errs, fmt.Errorf("%s: %d effects, want distinct − poison = %d", c, r.Effects[c], want))
		}
		if r.Doubled[c] != 0 {
			errs = append(errs, fmt.Errorf("%s: %d events took effect more than once", c, r.Doubled[c]))
		}
	}
	if r.Complete != r.Subjects {
		errs = append(errs, fmt.Errorf("projection: %d of %d subjects as expected", r.Complete, r.Subjects))
	}
	for code, n := range map[string]int{"parked events": r.Parked, "pending dead letters": r.PendingDeadLetters, "unsent outbox rows": r.Unsent} {
		if n != 0 {
			errs = append(errs, fmt.Errorf("%d %s left", n, code))
		}
	}
	return errors.Join(errs...)
}

// Print writes the report.
func (r Report) Print(w io.Writer) {
	fmt.Fprintf(w, "sent %d (distinct %d, duplicates %d), poison %d, failing their first attempt %d\n",
		r.Sent, r.Distinct, r.Duplicates, r.Poison, r.FailFirst)
	for _, c := range []string{EffectsConsumer, ProjectionConsumer} {
		fmt.Fprintf(w, "effects %s: %d (distinct − poison = %d), more than once: %d\n", c, r.Effects[c], r.Distinct-r.Poison, r.Doubled[c])
	}
	keys := make([]string, 0, len(r.DeadLetters))
	for k := range r.DeadLetters {
		keys = append(keys, k)
	}
	sortStrings(keys)
	for _, k := range keys {
		fmt.Fprintf(w, "dead letters %s: %d\n", k, r.DeadLetters[k])
	}
	fmt.Fprintf(w, "projection: %d of %d subjects complete, %d events applied; parked %d, pending dead letters %d, unsent %d\n",
		r.Complete, r.Subjects, r.Applied, r.Parked, r.PendingDeadLetters, r.Unsent)
	fmt.Fprintf(w, "faults: %d consumer processes killed (SIGKILL); %s\n", r.Kills, strings.Join(r.Faults, "; "))
	fmt.Fprintf(w, "took %s\n", r.Took.Round(time.Second))
}

func sortStrings(s []string) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}
