package app

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/fx"

	"github.com/effectively-once/effectively/framework"
	"github.com/effectively-once/effectively/handlers"
)

type gadgetV1 struct {
	Name string `json:"name"`
}

var gadgetAdded = framework.Define[gadgetV1]("gadgets.gadget.added", 1)

func handleGadget(context.Context, framework.Event[gadgetV1]) error { return nil }

// noisyError matches what fx and dig wrap a cause in: their names, the
// file and line of every constructor, a goroutine's stack.
var noisyError = regexp.MustCompile(`fx\.|dig\.|\.go:[0-9]+|asm_|goroutine|could not build|failed to build`)

// TestMainPrintsOneLine runs the service's command as Main does, with
// errors of the build: each is printed as one line that names its cause
// and the fix, without fx's chain of constructors. It sets the
// environment, so it does not run in parallel.
func TestMainPrintsOneLine(t *testing.T) {
	closedPort := func(t *testing.T) string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer l.Close()
		return l.Addr().String()
	}
	for _, tc := range []struct {
		name string
		env  func(t *testing.T) map[string]string
		opts fx.Option
		want string
		// operator: the operator's commands fail too (they build no
		// handler, so they do not see a handler's errors).
		operator bool
	}{
		{
			name: "DuplicateConsumer",
			opts: fx.Options(
				handlers.Register("gadgets.count", handlers.On(gadgetAdded, handleGadget)),
				handlers.Register("gadgets.count", handlers.On(gadgetAdded, handleGadget)),
			),
			want: "handlers: consumer name declared more than once: gadgets.count (a consumer name is an identity; give each consumer its own",
		},
		{
			name:     "BadConfiguration",
			env:      func(*testing.T) map[string]string { return map[string]string{EnvTransport: "carrier-pigeon"} },
			want:     EnvTransport,
			operator: true,
		},
		{
			name: "DatabaseDown",
			env: func(t *testing.T) map[string]string {
				url := "postgres://gadgets:s3cret@" + closedPort(t) + "/gadgets"
				return map[string]string{EnvTransport: TransportPostgres, EnvDatabaseURL: url}
			},
			want:     "database: postgres: ping:",
			operator: true,
		},
		{
			name: "MissingDependency",
			opts: handlers.Register("gadgets.count", handlers.On(gadgetAdded, func(*http.Client) framework.HandlerFunc[gadgetV1] {
				return handleGadget
			})),
			want: "missing type: *http.Client (a constructor of the service or of a handler takes it, and no option gives it: provide or supply it",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := map[string]string{
				EnvTransport: "", EnvDatabaseURL: filepath.Join(t.TempDir(), "app.db"), EnvTransportURL: "", EnvAMQPURL: "",
				EnvTablePrefix: "", EnvConfig: "", EnvAutoMigrate: "true", EnvHTTPAddr: "",
			}
			if tc.env != nil {
				for k, v := range tc.env(t) {
					env[k] = v
				}
			}
			for k, v := range env {
				t.Setenv(k, v)
			}
			if tc.opts == nil {
				tc.opts = fx.Options()
			}
			opts := fx.Options(tc.opts, fx.Supply(slog.New(slog.NewTextHandler(&bytes.Buffer{}, nil))))
			commands := [][]string{{"serve"}}
			if tc.operator {
				commands = append(commands, []string{"dead-letters", "list"}, []string{"migrate"})
			}
			for _, args := range commands {
				cmd := Command("gadgets", opts)
				cmd.SetArgs(args)
				var stderr bytes.Buffer
				require.Equal(t, 1, execute(context.Background(), cmd, &stderr), args)
				printed := stderr.String()
				require.True(t, strings.HasPrefix(printed, "gadgets: "), printed)
				require.Contains(t, printed, tc.want)
				require.Equal(t, 1, strings.Count(printed, "\n"), "one line: %s", printed)
				require.True(t, strings.HasSuffix(printed, "\n"), printed)
				require.NotRegexp(t, noisyError, printed)
				require.NotContains(t, printed, "s3cret")
			}
		})
	}
}

// TestUsageErrors runs the command line used wrongly: each mistake exits
// 1 with one line that ends with the command's usage, and a command of
// subcommands alone refuses an unknown one (it printed its help and
// exited 0, so a mistyped subcommand in a script passed). None needs the
// database.
func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"dead-letters", "lst"}, `unknown command "lst" for "gadgets dead-letters": did you mean list? (usage: gadgets dead-letters [command])`},
		{[]string{"dl", "bogus"}, `unknown command "bogus" for "gadgets dead-letters" (usage: gadgets dead-letters [command])`},
		{[]string{"events", "shw"}, `unknown command "shw" for "gadgets events": did you mean show?`},
		{[]string{"dead-letters", "show"}, "accepts 1 arg(s), received 0 (usage: gadgets dead-letters show ID [flags])"},
		{[]string{"dead-letters", "discard"}, "(usage: gadgets dead-letters discard ID... [flags])"},
		{[]string{"events", "show", "appointments"}, "(usage: gadgets events show SOURCE ID [flags])"},
		{[]string{"dead-letters", "list", "--bogus"}, "unknown flag: --bogus (usage: gadgets dead-letters list [flags])"},
		{[]string{"serve", "now"}, `unknown command "now" for "gadgets serve" (usage: gadgets serve [flags])`},
		{[]string{"help", "bogus"}, `unknown help topic "bogus" (usage: gadgets help [command] [flags])`},
		{[]string{"help", "dead-letters", "lst"}, `unknown help topic "dead-letters lst"`},
	} {
		cmd := Command("gadgets", fx.Options())
		cmd.SetArgs(tt.args)
		var out, stderr bytes.Buffer
		cmd.SetOut(&out)
		require.Equal(t, 1, execute(context.Background(), cmd, &stderr), "%v", tt.args)
		require.Equal(t, "gadgets: ", stderr.String()[:len("gadgets: ")], "%v", tt.args)
		require.Contains(t, stderr.String(), tt.want, "%v", tt.args)
		require.Equal(t, 1, strings.Count(stderr.String(), "\n"), "one line: %s", stderr.String())
		require.Empty(t, out.String(), "no help: %v", tt.args)
	}
	for _, args := range [][]string{{"dead-letters"}, {"events"}, {"dead-letters", "--help"}, {"help"}, {"help", "dead-letters"}} {
		cmd := Command("gadgets", fx.Options())
		cmd.SetArgs(args)
		var out, stderr bytes.Buffer
		cmd.SetOut(&out)
		require.Equal(t, 0, execute(context.Background(), cmd, &stderr), "%v", args)
		require.Contains(t, out.String(), "Available Commands:", "%v", args)
		require.Empty(t, stderr.String(), "%v", args)
	}
}

// TestFxLogsNoError shows that fx does not log the errors it returns: the
// one who receives them reports them, once.
func TestFxLogsNoError(t *testing.T) {
	t.Parallel()
	var logs bytes.Buffer
	var undo cleanup
	service := build(&undo,
		fx.Supply(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
		fx.Provide(func() (*http.Client, error) { return nil, errors.New("the cause, once") }),
		fx.Invoke(func(*http.Client) {}),
	)
	require.ErrorContains(t, service.Err(), "the cause, once")
	require.NotContains(t, logs.String(), "the cause, once")
}

func TestOneLine(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"one":                         "one",
		"first\nsecond\n":             "first; second",
		"connect to x:\n\ty: refused": "connect to x: y: refused",
		"a\r\n\n  b":                  "a; b",
	} {
		require.Equal(t, want, oneLine(in), "%q", in)
	}
}
