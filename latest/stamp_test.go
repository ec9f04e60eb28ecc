package latest_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/latest"
)

func TestStampNewer(t *testing.T) {
	t.Parallel()
	a := func(seq int64) latest.Stamp { return latest.Stamp{Subject: "a-1", Seq: seq} }
	for name, tc := range map[string]struct {
		s, stored latest.Stamp
		want      bool
	}{
		"GreaterSeq":            {s: a(9), stored: a(8), want: true},
		"SmallerSeq":            {s: a(8), stored: a(9), want: false},
		"EqualSeqIsNotNewer":    {s: a(9), stored: a(9), want: false},
		"NothingStored":         {s: a(1), stored: latest.Stamp{}, want: true},
		"NoSeqIsNeverNewer":     {s: a(0), stored: a(0), want: false},
		"NoSeqOverNothing":      {s: a(0), stored: latest.Stamp{}, want: false},
		"NoSubjectIsNeverNewer": {s: latest.Stamp{Seq: 9}, stored: latest.Stamp{}, want: false},
		"OtherSubject":          {s: latest.Stamp{Subject: "a-2", Seq: 9}, stored: a(1), want: false},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			require.Equal(t, tc.want, tc.s.Newer(tc.stored))
		})
	}
}

func TestStampValidate(t *testing.T) {
	t.Parallel()
	require.NoError(t, latest.Stamp{Subject: "a-1", Seq: 1}.Validate())
	for field, s := range map[string]latest.Stamp{
		"subject":    {Seq: 3},
		"subjectseq": {Subject: "a-1"},
	} {
		err := s.Validate()
		require.Error(t, err, field)
		require.True(t, framework.IsPermanent(err))
		require.Equal(t, latest.CodeUnsequenced, framework.CodeOf(err))
		var fe *framework.FieldError
		require.ErrorAs(t, err, &fe)
		require.Equal(t, field, fe.Field)
	}
	err := latest.Stamp{Subject: "a-1", Seq: -2}.Validate()
	require.Equal(t, latest.CodeUnsequenced, framework.CodeOf(err))
}

func TestStampOf(t *testing.T) {
	t.Parallel()
	got := latest.StampOf(framework.Attributes{ID: "e-1", Source: "s", Subject: "a-1", SubjectSeq: 7})
	require.Equal(t, latest.Stamp{Subject: "a-1", Seq: 7}, got)
}

func TestFromContextOutsideTheChain(t *testing.T) {
	t.Parallel()
	_, ok := latest.FromContext(t.Context())
	require.False(t, ok)
}
