package app_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/effectively-once/effectively/app"
)

// TestConsolePartitions shows a partitioned consumer's partitions on the
// console's consumers page, in a real headless Chromium, on PostgreSQL:
// the count and the live process, and a row per partition with its owner,
// token, lease, waiting messages (none once the events are handled) and
// its positions; the consumer's row says nothing waits for it.
func TestConsolePartitions(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	const n = 4
	cfg := partitionedConfig(t, n)
	cfg.Console = app.ConsoleConfig{Enabled: true, Tokens: []string{"bob:" + consoleReadSecret + ":read"}}
	b, _ := startService(t, cfg, widgetConsumer(consumerName))
	for i := range 12 {
		b.publish(t, fmt.Sprintf("w-%d", i), "gear")
	}
	waitFor(t, "the 12 widgets", func() bool { return b.count(t, `SELECT count(*) FROM widgets`) == 12 })

	ctx, _ := browser(t, exe)
	const stepLimit = 15 * time.Second
	run := func(what string, steps ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, stepLimit)
		defer cancel()
		require.NoError(t, chromedp.Do(ctx, steps...), what)
	}
	text := func(sel string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(ctx, stepLimit)
		defer cancel()
		s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
		require.NoError(t, err, sel)
		return s
	}
	base := "http://" + b.http.Addr() + "/console/"
	run("log in",
		chromedp.Navigate(base+"consumers"),
		chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), consoleReadSecret),
		chromedp.Submit(chromedp.CSS("#login")),
		chromedp.WaitVisible(chromedp.CSS("#consumers")),
	)
	table := fmt.Sprintf(`table.partitions[data-consumer=%q]`, consumerName)
	summary := fmt.Sprintf(`p.partitions-summary[data-consumer=%q]`, consumerName)
	// Every partition owned and nothing waiting: the page read again
	// until then (the process takes its leases in steps).
	var rows, member string
	deadline := time.Now().Add(waitLimit)
	for {
		run("the consumers page", chromedp.Navigate(base+"consumers"), chromedp.WaitVisible(chromedp.CSS(table)))
		rows = text(table + " tbody")
		m := regexp.MustCompile(`1 live process: (\S+)\.`).FindStringSubmatch(text(summary))
		if m != nil {
			member = m[1]
			owned := 0
			for _, line := range strings.Split(rows, "\n") {
				if strings.Contains(line, "\t"+member+"\t") && strings.Contains(line, "\t0\t") {
					owned++
				}
			}
			if owned == n {
				break
			}
		}
		require.True(t, time.Now().Before(deadline), "every partition owned, nothing waiting: %s", rows)
		time.Sleep(200 * time.Millisecond)
	}
	require.Equal(t, fmt.Sprintf("4 partitions; 1 live process: %s.", member), strings.Join(strings.Fields(text(summary)), " "))
	require.Equal(t, "Partition\tOwner\tToken\tLease expires in\tWaiting\tPosition", text(table+" thead tr"))
	lines := strings.Split(strings.TrimSpace(rows), "\n")
	require.Len(t, lines, n, rows)
	for p, line := range lines {
		require.Regexp(t, fmt.Sprintf(`^%d\t%s\t[1-9]\d*\t\d+s\t0\t%s@\d+ replay@\d+$`, p, regexp.QuoteMeta(member), regexp.QuoteMeta(widgetAdded.Type())), line)
	}
	// The consumer's lag, all partitions together, as the transport
	// counts it: nothing waits, so no age.
	require.Equal(t, "0", text("#consumers td.lag-waiting"))
	require.Equal(t, "-", text("#consumers td.lag-oldest"))
	if shots := os.Getenv(screenshotsVar); shots != "" {
		png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(shots, "console-partitions.png"), png, 0o644))
	}
}
