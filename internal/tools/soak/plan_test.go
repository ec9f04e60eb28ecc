package soak_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/internal/tools/soak"
)

// TestPlan checks the plan's shares and that each subject's events chain
// by Prev over the ones that are not poison, some written out of order,
// a subject's first event among them.
func TestPlan(t *testing.T) {
	p := soak.NewPlan(20000, 7)
	f := p.Figures()
	require.Equal(t, soak.Figures{Sent: 20000, Distinct: 19000, Poison: 190, FailFirst: 380, Duplicates: 1000}, f)
	require.Equal(t, p.Items, soak.NewPlan(20000, 7).Items, "the same seed, the same plan")

	seen := map[string]int64{} // subject: highest seq written so far
	swapped, firstLate := 0, 0
	bySubject := map[string][]soak.Item{}
	for _, it := range p.Items {
		if it.Subject == "" {
			require.True(t, it.Poison && it.Undecodable, "only undecodable poison has no subject")
			continue
		}
		if it.Seq < seen[it.Subject] {
			swapped++
			if it.Seq == 1 {
				firstLate++
			}
		}
		seen[it.Subject] = max(seen[it.Subject], it.Seq)
		bySubject[it.Subject] = append(bySubject[it.Subject], it)
	}
	require.NotZero(t, swapped, "no event written before an earlier one of its subject")
	require.NotZero(t, firstLate, "no subject's first event written after its second")
	for subject, items := range bySubject {
		bySeq := map[int64]soak.Item{}
		for _, it := range items {
			bySeq[it.Seq] = it
		}
		var prev int64
		for n := int64(1); n <= int64(len(items)); n++ {
			it, ok := bySeq[n]
			require.True(t, ok, "%s has no #%d", subject, n)
			require.Equal(t, prev, it.Prev, "%s #%d", subject, n)
			if !it.Poison {
				prev = n
			}
		}
		require.Equal(t, prev, p.Expected()[subject][0])
	}
}
