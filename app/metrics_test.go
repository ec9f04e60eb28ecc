package app_test

import (
	"bytes"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/fx"
	"gopkg.in/yaml.v3"

	"github.com/effectively-once/effectively/framework/driver"
)

// TestFiguresMetrics: the pending dead letters (by consumer and code) and
// the parked events (by consumer) are gauges read from the database, so a
// dead letter stored by another process shows; a replay and a discard
// through the service's store count, by consumer.
func TestFiguresMetrics(t *testing.T) {
	t.Parallel()
	var store driver.Store
	b := setup(t, testConfig(t), fx.Populate(&store))
	// Stored through a store of its own, as another process would.
	first := storeDeadLetter(t, b.db, consumerName, "dl-1", "", 0)
	second := storeDeadLetter(t, b.db, consumerName, "dl-2", "", 0)
	storeDeadLetter(t, b.db, "other.consumer", "dl-3", "", 0)
	_, err := b.db.Exec(`INSERT INTO parked_events (consumer, subject, seq, source, event_id, body, parked_at, reason)
VALUES (?, 's', 2, 'widgets', 'p-2', x'7b7d', 0, 'parked')`, consumerName)
	require.NoError(t, err)

	pending := `effectively_dead_letters_pending{code="widget_rejected",consumer="` + consumerName + `"} `
	waitFor(t, "the gauges", func() bool {
		m := metrics(t, b)
		return strings.Contains(m, pending+"2\n") &&
			strings.Contains(m, `effectively_dead_letters_pending{code="widget_rejected",consumer="other.consumer"} 1`+"\n") &&
			strings.Contains(m, `effectively_parked_events{consumer="`+consumerName+`"} 1`+"\n")
	})

	ctx := t.Context()
	_, err = store.ResolveDeadLetter(ctx, first, driver.Resolution{Status: driver.DeadLetterReplayed, By: "ops", Reason: "fixed"})
	require.NoError(t, err)
	_, err = store.ResolveDeadLetter(ctx, second, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops", Reason: "obsolete"})
	require.NoError(t, err)
	m := metrics(t, b)
	require.Contains(t, m, `effectively_dead_letter_replays_total{consumer="`+consumerName+`"} 1`+"\n")
	require.Contains(t, m, `effectively_dead_letter_discards_total{consumer="`+consumerName+`"} 1`+"\n")
	waitFor(t, "the gauge read again", func() bool { return !strings.Contains(metrics(t, b), pending) })
}

// TestAlertRules parses the alert rules of docs/operations.md and finds
// every metric they name in a scrape of a service that dead-lettered,
// parked, replayed and discarded.
func TestAlertRules(t *testing.T) {
	t.Parallel()
	rules := alertRules(t)
	require.NotEmpty(t, rules.Groups)

	var (
		store driver.Store
		reg   prometheus.Registerer
	)
	b := setup(t, testConfig(t), fx.Populate(&store, &reg))
	for _, id := range []string{"dl-1", "dl-2"} {
		storeDeadLetter(t, b.db, consumerName, id, "", 0)
	}
	_, err := b.db.Exec(`INSERT INTO parked_events (consumer, subject, seq, source, event_id, body, parked_at, reason)
VALUES (?, 's', 2, 'widgets', 'p-2', x'7b7d', 0, 'parked')`, consumerName)
	require.NoError(t, err)
	dls, err := store.DeadLetters(t.Context(), driver.DeadLetterFilter{Consumer: consumerName})
	require.NoError(t, err)
	_, err = store.ResolveDeadLetter(t.Context(), dls[0].ID, driver.Resolution{Status: driver.DeadLetterReplayed, By: "ops", Reason: "fixed"})
	require.NoError(t, err)
	_, err = store.ResolveDeadLetter(t.Context(), dls[1].ID, driver.Resolution{Status: driver.DeadLetterDiscarded, By: "ops", Reason: "obsolete"})
	require.NoError(t, err)
	b.publish(t, "e-1", "one")
	// dl-1's replay takes effect too, in any order: count e-1's alone.
	waitFor(t, "the effect", func() bool { return b.count(t, `SELECT count(*) FROM widgets WHERE event_id = 'e-1'`) == 1 })
	// A message that is no CloudEvent: dead-lettered by the consumer.
	require.NoError(t, b.transport.Publisher().Publish(widgetAdded.Type(), message.NewMessage("poison", []byte("not json"))))
	// The gauges read from the database are cached a few seconds: a
	// scrape before the dead letter was stored may hide it that long.
	var scrape string
	waitFor(t, "the poison's dead letter in the counters and the gauges", func() bool {
		scrape = metrics(t, b)
		return strings.Contains(scrape, "effectively_dead_letters_total{") && strings.Contains(scrape, "effectively_dead_letters_pending{")
	})

	names := regexp.MustCompile(`effectively_[a-z_]+`)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			require.NotEmpty(t, r.Alert)
			require.NotEmpty(t, r.Annotations["summary"], "alert %s", r.Alert)
			found := names.FindAllString(r.Expr, -1)
			require.NotEmpty(t, found, "alert %s names a metric", r.Alert)
			for _, name := range found {
				if regexp.MustCompile(`(?m)^` + name + `(_bucket|_sum|_count)?[{ ]`).MatchString(scrape) {
					continue
				}
				// A metric whose series come only with what it counts
				// (effectively_outbox_unroutable_rows, by event type) is
				// not scraped here: the service registered it, so that
				// the name is taken.
				err := reg.Register(prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: "probe"}))
				require.Error(t, err, "alert %s: metric %s is neither scraped nor registered", r.Alert, name)
			}
			if strings.Contains(r.Expr, "effectively_dead_letters_pending") || strings.Contains(r.Expr, "effectively_parked_events") {
				require.Contains(t, r.Expr, "max", "alert %s: the gauges read from the database are the same in every replica", r.Alert)
			}
		}
	}
}

// ruleFile is the shape of a Prometheus rule file, as much of it as the
// test reads.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// alertRules returns the rule file of docs/operations.md: its YAML block
// that starts with "groups:", parsed strictly.
func alertRules(t *testing.T) ruleFile {
	t.Helper()
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	block := regexp.MustCompile("(?s)```yaml\n(groups:.*?)```").FindSubmatch(doc)
	require.NotNil(t, block, "docs/operations.md has a YAML block of alert rules")
	var rules ruleFile
	dec := yaml.NewDecoder(bytes.NewReader(block[1]))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&rules))
	return rules
}
